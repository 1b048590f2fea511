"""Lab 7, graded: the 70B calculation (``capacity``), number by number, against the kit's
planner and formulas, which are computed here: the planner's model shapes
(``perf/planner/model_spec``) and memory estimate, ZeRO's bytes (``hybrid/zero``), Korthikanti
et al.'s activation bytes (``memory/activation_memory``), the pipeline's closed-form bubble
(``pipeline/pipeline_simulator``) and the planner's time estimate of the TP collectives.

Every argument is exercised where ignoring it gives another number: GQA (kv_heads < heads)
and MHA, gated and plain MLPs, tied embeddings; TP and PP degrees that do not divide the
layers; each ZeRO stage under both accountings; TP with and without SP, flash attention,
dropout; 1F1B and interleaved pipelines with fewer microbatches than stages. Integers are
compared exactly, byte counts to a relative 1e-12.
"""
import math

import pytest

from reference_impl.memory.activation_memory import activation_memory_formula
from reference_impl.memory.model_states import zero_memory_formula
from reference_impl.perf.planner import Layout, cluster_of, evaluate, get_model
from reference_impl.perf.planner.framework_memory import model_state_bytes
from reference_impl.perf.planner.memory_estimate import in_flight_microbatches
from reference_impl.pipeline.pipeline_simulator import bubble_formula

pytestmark = pytest.mark.lab7

REL = 1e-12
PRESETS = ("70b", "7b", "405b", "gpt3-175b")


def student_values(impl, calls):
    """``calls``: (function name, args, kwargs) of the student's ``capacity``; every result,
    as a float."""
    capacity = impl.module("capacity")
    return [float(getattr(capacity, name)(*args, **kwargs)) for name, args, kwargs in calls]


def run(run_alone, impl, calls):
    return run_alone(student_values, impl, calls)


def spec_arguments(model):
    return ((model.layers, model.hidden, model.heads, model.kv_heads or model.heads, model.ffn,
             model.vocab), {"gated": model.gated_mlp, "tied": model.tied_embeddings})


def test_parameters_of_llama_and_gpt_shapes(impl, run_alone):
    models = [get_model(name) for name in PRESETS]
    found = run(run_alone, impl, [("llama_parameters", *spec_arguments(m)) for m in models])
    for model, value in zip(models, found):
        assert value == model.num_params, (
            f"llama_parameters for {model.name} = {value:,.0f}, the planner counts "
            f"{model.num_params:,}. Likely mistake: K and V have kv_heads x head size columns "
            "each (grouped-query attention), not h; a gated (SwiGLU) MLP has 3 matrices of "
            "h x ffn, a plain one 2; the output layer counts again unless tied")


def test_first_stage_parameters(impl, run_alone):
    model = get_model("70b")
    layouts = [(8, 4), (2, 8), (1, 16), (4, 3), (8, 1)]
    found = run(run_alone, impl, [("first_stage_parameters", (model.params_per_layer,
                                    model.layers, model.vocab, model.hidden, tp, pp), {})
                                   for tp, pp in layouts])
    for (tp, pp), value in zip(layouts, found):
        expected = (math.ceil(model.layers / pp) * model.params_per_layer / tp
                    + model.vocab * model.hidden / tp)
        # The planner's own number, where the first stage is the one it reports:
        if pp > 1 and 128 % (tp * pp) == 0:
            memory = evaluate(model, cluster_of("h100", nodes=16, gpus_per_node=8),
                              Layout(tp, pp, 128 // (tp * pp)), 1024).memory
            if memory.stage == "first":
                assert expected == pytest.approx(memory.params_per_gpu, rel=REL)
        assert value == pytest.approx(expected, rel=REL), (
            f"first_stage_parameters at TP {tp} x PP {pp} = {value:,.0f}, expected "
            f"{expected:,.0f}: ceil(layers / pp) layers on the stage (80 / 3 leaves 27 on the "
            "first), every layer and the embedding split over the tp GPUs")


def test_model_state_bytes_per_parameter(impl, run_alone):
    cases = [(stage, shards, "zero") for stage in (0, 1, 2, 3) for shards in (1, 4, 6)]
    cases += [(stage, shards, "megatron") for stage in (0, 1) for shards in (1, 4, 6)]
    found = run(run_alone, impl, [("model_state_bytes_per_parameter", case, {})
                                   for case in cases])
    params = 10 ** 9
    for (stage, shards, accounting), value in zip(cases, found):
        if accounting == "zero":
            expected = zero_memory_formula(params, shards, stage) / params
        else:
            expected = model_state_bytes(params, shards, stage, "megatron") / params
        assert value == pytest.approx(expected, rel=REL), (
            f"model_state_bytes_per_parameter(stage {stage}, shards {shards}, {accounting}) = "
            f"{value}, expected {expected}. Likely mistake: ZeRO-1 shards the 12 optimizer "
            "bytes, ZeRO-2 also the gradient, ZeRO-3 the weight too (the rest stay whole); "
            "Megatron-LM keeps a 4-byte fp32 gradient (18 bytes unsharded, 6 + 12/d with its "
            "distributed optimizer)")


ACTIVATION_CASES = [  # (s, b, h, a, t, sequence_parallel, flash, dropout)
    (4096, 1, 8192, 64, 8, True, True, False),     # the lab's 70B layout
    (2048, 2, 4096, 32, 4, False, False, True),    # GPT-style, TP only
    (2048, 2, 4096, 32, 4, True, False, True),     # TP + SP
    (1024, 4, 2048, 16, 1, False, False, True),    # no parallelism: sbh (34 + 5as/h)
    (1024, 4, 2048, 16, 2, False, True, False),    # flash, no dropout, TP without SP
    (4096, 1, 8192, 64, 8, True, False, False),    # scores kept, no dropout
]


def test_activation_bytes_per_layer(impl, run_alone):
    found = run(run_alone, impl, [
        ("activation_bytes_per_layer", (s, b, h, a, t),
         {"sequence_parallel": sp, "flash": flash, "dropout": dropout})
        for s, b, h, a, t, sp, flash, dropout in ACTIVATION_CASES])
    for (s, b, h, a, t, sp, flash, dropout), value in zip(ACTIVATION_CASES, found):
        expected = activation_memory_formula(s, b, h, a, t, sequence_parallel=sp,
                                             mask_bytes=1 if dropout else 0,
                                             attention="sdpa" if flash else "explicit")
        assert value == pytest.approx(expected, rel=REL), (
            f"activation_bytes_per_layer(s={s}, b={b}, h={h}, a={a}, t={t}, sp={sp}, "
            f"flash={flash}, dropout={dropout}) = {value:,.0f}, Korthikanti et al. give "
            f"{expected:,.0f}. Likely mistake: without SP the 10 sbh of layernorm inputs and "
            "dropout masks are not split by t (with SP they are); no dropout removes 2 sbh of "
            "masks and the a s^2 b mask; flash attention keeps 4 a s b / t bytes, no scores")


def test_microbatches_in_flight_and_the_bubble(impl, run_alone):
    cases = [(4, 256, 1), (8, 32, 5), (8, 4, 1), (4, 2, 2), (1, 8, 1), (16, 64, 4)]
    found = run(run_alone, impl, [(name, case, {}) for case in cases
                                  for name in ("in_flight_microbatches", "bubble_fraction")])
    for index, (pp, m, v) in enumerate(cases):
        held, bubble = found[2 * index], found[2 * index + 1]
        expected_held = in_flight_microbatches(pp, m, v)
        assert held == pytest.approx(expected_held, rel=REL), (
            f"in_flight_microbatches(pp={pp}, m={m}, v={v}) = {held}, the planner holds "
            f"{expected_held}: 1F1B's first stage holds min(pp, m), interleaved 1F1B a factor "
            "1 + (pp-1)/(pp v) more")
        expected_bubble = bubble_formula("interleaved" if v > 1 else "1f1b", pp, m, v)
        assert bubble == pytest.approx(expected_bubble, rel=1e-9, abs=1e-15), (
            f"bubble_fraction(pp={pp}, m={m}, v={v}) = {bubble}, expected "
            f"{expected_bubble}: (p-1)/(m+p-1), and (p-1)/(vm+p-1) with v chunks per rank")


def test_tp_all_reduce_volume_and_time_per_layer(impl, run_alone):
    model = get_model("70b")
    cluster = cluster_of("h100", nodes=16, gpus_per_node=8)
    s, h = model.seq_len, model.hidden
    bandwidth = cluster.intra_bw_gbs * 1e9
    calls = [("tp_all_reduce_bytes_per_layer", (1, s, h), {}),
             ("tp_all_reduce_bytes_per_layer", (2, 1024, 512), {"bytes_per_element": 4})]
    calls += [("tp_seconds_per_layer", (1, s, h, tp, cluster.intra_alpha, bandwidth), {})
              for tp in (8, 2)]
    calls += [("tp_seconds_per_layer", (2, 1024, 512, 4, 1e-5, 1e10), {"bytes_per_element": 4})]
    volume, volume_fp32, seconds_tp8, seconds_tp2, seconds_fp32 = run(run_alone, impl, calls)
    assert volume == 4 * 2 * s * h, (
        f"tp_all_reduce_bytes_per_layer = {volume:,.0f}, expected {4 * 2 * s * h:,}: 4 "
        "all-reduces per layer (2 forward, 2 backward) of the b x s x h activation, 2 bytes each")
    assert volume_fp32 == 4 * 2 * 1024 * 512 * 4, (
        f"tp_all_reduce_bytes_per_layer with bytes_per_element=4 = {volume_fp32:,.0f}: honour "
        "bytes_per_element")
    for tp, value in ((8, seconds_tp8), (2, seconds_tp2)):
        recipe = evaluate(model, cluster, Layout(tp, 128 // (tp * 4), 4), 1024)
        assert value == pytest.approx(recipe.time.tp_comm_s, rel=1e-9), (
            f"tp_seconds_per_layer at TP {tp} = {value * 1e3:.4f} ms, the planner's "
            f"{recipe.time.tp_comm_s * 1e3:.4f} ms: 4 ring all-reduces of b s h x 2 bytes over "
            "the tp GPUs, each 2(n-1) alpha + 2(n-1)/n S / B")
    # The ring all-reduce's cost written out: in a handout, lab 0's alpha_beta is a stub here.
    n, nbytes, alpha, bandwidth = 4, 2 * 1024 * 512 * 4, 1e-5, 1e10
    expected = 4 * (2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth)
    assert seconds_fp32 == pytest.approx(expected, rel=1e-12), (
        f"tp_seconds_per_layer with 4-byte elements = {seconds_fp32}, expected {expected}")
