"""Lab 7, graded: what the capacity model's formulas promise besides their values
(``reference_impl.course.contracts``: each property checked on the submission against itself,
within 1e-6 absolute and 1e-5 relative).

* ``bubble_fraction``: one stage has no bubble; more micro-batches never give more bubble;
* ``pipeline_seconds`` and ``stage_seconds`` scale with the times they are given;
* ``tp_all_reduce_bytes_per_layer`` and ``activation_bytes_per_layer`` scale with the batch;
* ``model_state_bytes_per_parameter``: sharding over one rank changes nothing at any stage, and
  more shards never hold more bytes.

Draws: 2 to 8 stages, 1 to 32 micro-batches, 1 and 2 chunks per rank; layer sizes of the lab's
tables. The hidden tier draws others.
"""
import pytest

from reference_impl.course.contracts import ReadsOnly, Relation, assert_contract, at_most

pytestmark = pytest.mark.lab7

PIPELINES = {"pp 4, m 8": (4, 8, 1), "pp 2, m 3": (2, 3, 1), "pp 8, m 32, v 2": (8, 32, 2),
             "pp 4, m 1": (4, 1, 1), "pp 3, m 12, v 2": (3, 12, 2)}


def one_stage(bubble_fraction, args) -> tuple:
    _, microbatches, _ = args
    return (float(bubble_fraction(1, microbatches, 1)), 0.0)


def more_microbatches(bubble_fraction, args) -> tuple:
    pp, microbatches, v = args
    return bubble_fraction(pp, 2 * microbatches, v), bubble_fraction(pp, microbatches, v)


def scaled_first(function, args) -> tuple:
    """``function`` with its first argument (a time) doubled gives twice the time."""
    first, *rest = args
    return (function(2 * first, *rest), 2 * function(first, *rest))


def scaled_times(stage_seconds, args) -> tuple:
    layers, pp, layer_s, tp_s, head_s = args
    return (stage_seconds(layers, pp, 2 * layer_s, 2 * tp_s, 2 * head_s),
                   2 * stage_seconds(layers, pp, layer_s, tp_s, head_s))


def scaled_batch(function, args, batch_at: int) -> tuple:
    doubled = list(args)
    doubled[batch_at] *= 2
    return (float(function(*doubled)), 2 * float(function(*args)))


def batch_first(function, args) -> tuple:
    return scaled_batch(function, args, 0)


def batch_second(function, args) -> tuple:
    return scaled_batch(function, args, 1)


STAGES = {"zero": (0, 1, 2, 3), "megatron": (0, 1)}  # the ZeRO stages each accounting has


def one_shard(model_state_bytes_per_parameter, args) -> tuple:
    _, _, accounting = args
    return ([float(model_state_bytes_per_parameter(stage, 1, accounting))
                    for stage in STAGES[accounting]],
                   [float(model_state_bytes_per_parameter(0, 1, accounting))] * len(STAGES[accounting]))


def more_shards(model_state_bytes_per_parameter, args) -> tuple:
    stage, shards, accounting = args
    return (model_state_bytes_per_parameter(stage, 2 * shards, accounting),
            model_state_bytes_per_parameter(stage, shards, accounting))


BUBBLE = (Relation("gives one stage no bubble", one_stage),
          Relation("gives no more bubble with twice the micro-batches", more_microbatches, at_most))
PIPELINE = (Relation("scales with the stage's time", scaled_first),)
STAGE = (Relation("scales with the times it is given", scaled_times),)
TP_BYTES = (Relation("scales with the batch", batch_first),)
ACTIVATIONS = (Relation("scales with the batch", batch_second),)
MODEL_STATE = (ReadsOnly(), Relation("changes nothing at any stage over one shard", one_shard),
               Relation("holds no more bytes over twice the shards", more_shards, at_most))


def test_bubble_fraction_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "capacity", "bubble_fraction", BUBBLE, PIPELINES)


def test_pipeline_seconds_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "capacity", "pipeline_seconds", PIPELINE,
                    {label: (0.25, *sizes) for label, sizes in PIPELINES.items()})


def test_stage_seconds_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "capacity", "stage_seconds", STAGE,
                    {"32 layers on 4 stages": (32, 4, 0.01, 0.002, 0.02),
                     "24 layers on 8 stages": (24, 8, 0.01, 0.003, 0.05),
                     "9 layers on 3 stages": (9, 3, 0.02, 0.0, 0.01)})


def test_tp_all_reduce_bytes_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "capacity", "tp_all_reduce_bytes_per_layer", TP_BYTES,
                    {"b 1, s 2048, h 4096": (1, 2048, 4096, 2), "b 3, s 512, h 1024": (3, 512, 1024, 4)})


def test_activation_bytes_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "capacity", "activation_bytes_per_layer", ACTIVATIONS,
                    {"s 2048, b 1, h 4096, a 32, t 1": (2048, 1, 4096, 32, 1),
                     "s 4096, b 2, h 8192, a 64, t 8": (4096, 2, 8192, 64, 8)})


def test_model_state_bytes_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "capacity", "model_state_bytes_per_parameter", MODEL_STATE,
                    {f"stage {stage}, {shards} shards, {accounting}": (stage, shards, accounting)
                     for accounting, stages in STAGES.items() for stage in stages
                     for shards in (2, 8)})
