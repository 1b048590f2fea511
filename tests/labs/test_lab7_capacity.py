"""Lab 7, graded: the 70B calculation (``capacity``), number by number, and a step from its
parts.

The expected values are lab 7's snapshot (``tests/labs/snapshots/lab7.pt``): what the
reference gives on each case, and, for the step's composition, the planner's own terms on
layouts it evaluates (the layer's time, the exposed TP collectives, the LM head, the exposed
DP time; the slowest stage, the pipeline and the step by cause it makes of them). Hand-checked
cases (worked out in the comments) pin the step's rules down on round numbers, and sweeps of
layouts whose sizes do not divide check that the refusals name the numbers.

Every argument is exercised where ignoring it gives another number: GQA (kv_heads < heads)
and MHA, gated and plain MLPs, tied embeddings; TP and PP degrees that do not divide the
layers; each ZeRO stage under both accountings; TP with and without SP, flash attention,
dropout; 1F1B and interleaved pipelines with fewer microbatches than stages; sharded and
unsharded optimizers, collectives longer and shorter than the compute they overlap. Integers
are compared exactly, byte counts and seconds to a relative 1e-12 (1e-9 against the planner).
"""
import pytest

from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import draw, label

pytestmark = pytest.mark.lab7

REL = 1e-12
STEP_TERMS = ("layers", "TP", "LM head", "bubble", "DP")
MISTAKES = {  # a question about the property that fails, never its formula
    "llama_parameters": "count each matrix by its shape: how many columns do K and V have under "
                        "grouped-query attention, how many matrices does a gated (SwiGLU) MLP "
                        "have, and does the output layer count when it is tied?",
    "first_stage_parameters": "how many layers does the first stage hold when pp does not divide "
                              "the layers (80 over 3), and which of its parts are split over "
                              "the tp GPUs?",
    "model_state_bytes_per_parameter": "which of the weight's, the gradient's and the "
                                       "optimizer's bytes does each stage shard, and in what "
                                       "precision does Megatron-LM keep the gradient?",
    "activation_bytes_per_layer": "which terms does tensor parallelism split without sequence "
                                  "parallelism, and which only with it? what do no dropout and "
                                  "flash attention leave out?",
    "in_flight_microbatches": "how many microbatches has the first stage started before its "
                              "first backward, m smaller than pp too, and how does "
                              "interleaving change that?",
    "bubble_fraction": "how many idle slots against busy ones, for p stages and m microbatches, "
                       "and how long is an idle slot with v chunks per rank?",
    "tp_all_reduce_bytes_per_layer": "how many all-reduces does a layer make in its forward and "
                                     "in its backward, and of which tensor?",
    "tp_seconds_per_layer": "each of the layer's TP all-reduces is lab 0's ring all-reduce over "
                            "the tp GPUs: how many, of how many bytes, and what does one cost "
                            "on one GPU?",
    "dp_exposed_seconds": "what share of an all-reduce is a reduce-scatter or an all-gather, "
                          "behind which part of the stage does each hide, and is each part's "
                          "exposed time clipped on its own?",
    "stage_seconds": "which layers does the slowest stage run, what does each of them pay, and "
                     "on which stage does the LM head run?",
    "pipeline_seconds": "how many slots of the slowest stage does 1F1B take for m microbatches, "
                        "and how does interleaving with v chunks shrink the extra ones?",
}
STEP_MISTAKES = {
    "layers": "the layers' compute: which of the layers does the stage run, and how often?",
    "TP": "the exposed TP time: which layers pay it, and how often?",
    "LM head": "the LM head: on which stage does it run, and how often?",
    "bubble": "the bubble is what the pipeline takes beyond m slots of the slowest stage "
              "(the pipeline less m x stage), not a fraction of the layers alone",
    "DP": "the exposed DP time: how often is it paid in a step?",
    "step": "the step is the sum of the terms",
}


def student_calls(impl, calls):
    """``calls``: (function name, args, kwargs) of the student's ``capacity``; each result as
    ("value", a float or a dict of floats) or ("ValueError", its message)."""
    capacity = impl.module("capacity")
    results = []
    for name, args, kwargs in calls:
        try:
            value = getattr(capacity, name)(*args, **kwargs)
        except ValueError as error:
            results.append(("ValueError", str(error)))
            continue
        results.append(("value", {key: float(term) for key, term in value.items()}
                        if isinstance(value, dict) else float(value)))
    return results


def run(run_alone, impl, calls):
    return run_alone(student_calls, impl, calls)


def call_text(name, args, kwargs):
    return f"{name}({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"


def check_value(name, args, kwargs, result, expected, rel=REL, source="the reference gives"):
    where = call_text(name, args, kwargs)
    kind, value = result
    assert kind == "value", f"{where} raised ValueError: {value}; these arguments are valid"
    if isinstance(expected, int) and not isinstance(expected, bool):
        assert value == expected, (f"{where} = {value:,.0f}, {source} {expected:,}. Ask: "
                                   f"{MISTAKES[name]}")
    else:
        assert value == pytest.approx(expected, rel=rel, abs=1e-15), (
            f"{where} = {value:.10g}, {source} {expected:.10g}. Ask: "
            f"{MISTAKES[name]}")


def check_function(impl, run_alone, names, cases="public"):
    """The student's functions ``names`` (one, or several) on the snapshot's cases, in one
    helper process."""
    names = (names,) if isinstance(names, str) else names
    expected = [(name, case) for name in names for case in snapshot("lab7", f"{name}/{cases}")]
    found = run(run_alone, impl, [(name, args, kwargs) for name, (args, kwargs, _) in expected])
    for (name, (args, kwargs, value)), result in zip(expected, found):
        check_value(name, args, kwargs, result, value)


def check_planner_tp_time(impl, run_alone, cases="public"):
    expected = snapshot("lab7", f"tp_comm/{cases}")
    found = run(run_alone, impl, [("tp_seconds_per_layer", args, kwargs)
                                  for args, kwargs, _ in expected])
    for (args, kwargs, value), result in zip(expected, found):
        check_value("tp_seconds_per_layer", args, kwargs, result, value, 1e-9,
                    "the planner's time of one layer's TP collectives is")


def test_parameters_of_llama_and_gpt_shapes(impl, run_alone):
    check_function(impl, run_alone, "llama_parameters")


def test_first_stage_parameters(impl, run_alone):
    check_function(impl, run_alone, "first_stage_parameters")


def test_model_state_bytes_per_parameter(impl, run_alone):
    check_function(impl, run_alone, "model_state_bytes_per_parameter")


def test_activation_bytes_per_layer(impl, run_alone):
    check_function(impl, run_alone, "activation_bytes_per_layer")


def test_microbatches_in_flight_and_the_bubble(impl, run_alone):
    check_function(impl, run_alone, ("in_flight_microbatches", "bubble_fraction"))


def test_tp_all_reduce_volume_and_time_per_layer(impl, run_alone):
    check_function(impl, run_alone, ("tp_all_reduce_bytes_per_layer", "tp_seconds_per_layer"))
    check_planner_tp_time(impl, run_alone)


# ------------------------------------------------------------ a step from its parts

# By hand, round numbers (seconds):
# * 8 layers on 4 stages, layer 3, TP 1, head 2: a stage is 2 x (3 + 1) + 2 = 10.
# * that stage, 1F1B over 4 stages, 6 microbatches: (6 + 3) x 10 = 90, the bubble 30;
#   interleaved with v = 3 and 8 microbatches: (8 + 3/3) x 10 = 90, the bubble 10.
# * the step of the first: layers 6 x 2 x 3 = 36, TP 6 x 2 x 1 = 12, head 6 x 2 = 12,
#   bubble 30, DP 5: 95.
# * DP over 4 ranks, alpha 0, 1 byte/s: an all-reduce of 8 bytes is 2 x 3/4 x 8 = 12, a
#   reduce-scatter 6; stage 3 (backward 2, forward 1). Unsharded: 12 - 2 = 10. Sharded, the
#   gather of 4 bytes is 3: (6 - 2) + (3 - 1) = 6. With a stage of 12 (backward 8, forward
#   4) both hide: 0 + 0 = 0, not a negative time.
HAND_STAGES = [((8, 4, 3.0, 1.0, 2.0), 10.0), ((8, 1, 3.0, 1.0, 0.0), 32.0),
               ((6, 6, 0.5, 0.25, 1.0), 1.75)]
HAND_PIPELINES = [((10.0, 4, 6, 1), 90.0), ((10.0, 4, 8, 3), 90.0), ((2.0, 1, 5, 1), 10.0),
                  ((1.0, 2, 1, 1), 2.0)]
HAND_DP = [((8.0, 4.0, 4, 0.0, 1.0, 3.0, False), 10.0), ((8.0, 4.0, 4, 0.0, 1.0, 3.0, True), 6.0),
           ((8.0, 4.0, 4, 0.0, 1.0, 12.0, True), 0.0), ((8.0, 4.0, 1, 1.0, 1.0, 0.0, True), 0.0)]
HAND_STEP = ((8, 4, 6, 3.0, 1.0, 2.0, 5.0, 1),
             {"layers": 36.0, "TP": 12.0, "LM head": 12.0, "bubble": 30.0, "DP": 5.0,
              "step": 95.0})


def check_hand_cases(impl, run_alone):
    calls = ([("stage_seconds", args, {}) for args, _ in HAND_STAGES]
             + [("pipeline_seconds", args, {}) for args, _ in HAND_PIPELINES]
             + [("dp_exposed_seconds", args, {}) for args, _ in HAND_DP]
             + [("step_breakdown", HAND_STEP[0], {})])
    found = iter(run(run_alone, impl, calls))
    for name, cases in (("stage_seconds", HAND_STAGES), ("pipeline_seconds", HAND_PIPELINES),
                        ("dp_exposed_seconds", HAND_DP)):
        for args, value in cases:
            check_value(name, args, {}, next(found), value, source="by hand,")
    kind, terms = next(found)
    check_breakdown(call_text("step_breakdown", HAND_STEP[0], {}), kind, terms, HAND_STEP[1],
                    "by hand,")


def check_breakdown(where, kind, terms, expected, source, rel=REL):
    assert kind == "value", f"{where} raised ValueError: {terms}; these arguments are valid"
    assert isinstance(terms, dict) and set(terms) == set(expected), (
        f"{where} returned the terms {sorted(terms) if isinstance(terms, dict) else terms}, "
        f"expected {sorted(expected)}")
    for name, value in expected.items():
        assert terms[name] == pytest.approx(value, rel=rel, abs=1e-12), (
            f"{where}: {name} = {terms[name]:.10g} s, {source} {value:.10g} s. Ask: "
            f"{STEP_MISTAKES[name]}")


def check_planner_step(impl, run_alone, cases="public"):
    """The stage, the pipeline and the step by cause, from the planner's parts, against what
    the planner makes of them."""
    layouts = snapshot("lab7", f"planner/{cases}")
    calls = []
    for case in layouts:
        parts = (case["model_layers"], case["pp"])
        calls += [("stage_seconds", (*parts, case["layer_s"], case["tp_s"], case["head_s"]), {}),
                  ("pipeline_seconds", (case["stage_s"], case["pp"], case["microbatches"],
                                        case["v"]), {}),
                  ("step_breakdown", (*parts, case["microbatches"], case["layer_s"],
                                      case["tp_s"], case["head_s"], case["dp_s"], case["v"]), {})]
    found = iter(run(run_alone, impl, calls))
    for case in layouts:
        for name, value in (("stage_seconds", case["stage_s"]),
                            ("pipeline_seconds", case["pipeline_s"])):
            kind, result = next(found)
            assert kind == "value", f"{name} on the planner's {case['layout']} raised: {result}"
            assert result == pytest.approx(value, rel=1e-9), (
                f"{name} on the planner's {case['layout']} ({case['microbatches']} "
                f"microbatches) = {result:.10g} s, the planner's {value:.10g} s. Ask: "
                f"{MISTAKES[name]}")
        kind, terms = next(found)
        expected = {name: case[name] for name in STEP_TERMS}
        expected["step"] = sum(expected.values())
        check_breakdown(f"step_breakdown on the planner's {case['layout']}", kind, terms,
                        expected, "the planner's", 1e-9)


def check_refusals(impl, run_alone, seed):
    """Layouts whose sizes do not divide are refused, naming the numbers; those that divide
    are not. With a layer of 1 s and nothing else, a stage is its number of layers."""
    configs = draw({"layers": [80, 30, 7, 126, 1], "pp": [1, 3, 4, 16, 5],
                    "microbatches": [1, 6, 64, 10], "v": [1, 2, 5]}, seed, extra=12)
    calls = [("stage_seconds", (c["layers"], c["pp"], 1.0, 0.0, 0.0), {}) for c in configs]
    calls += [("pipeline_seconds", (1.0, c["pp"], c["microbatches"], c["v"]), {})
              for c in configs]
    found = run(run_alone, impl, calls)
    stages, pipelines = found[:len(configs)], found[len(configs):]
    for config, (kind, result) in zip(configs, stages):
        where = (f"stage_seconds({config['layers']} layers, pp {config['pp']}) "
                 f"[{label(config, seed)}]")
        if config["layers"] % config["pp"]:
            assert kind == "ValueError", (
                f"{where} = {result}: {config['layers']} layers do not split evenly over "
                f"{config['pp']} stages, so it must raise ValueError (the slowest stage "
                "depends on how they are balanced)")
            for number in (config["layers"], config["pp"]):
                assert str(number) in result, (
                    f"{where}'s error {result!r} does not name {number}: name the layers and "
                    "the stages")
        else:
            assert kind == "value" and result == config["layers"] // config["pp"], (
                f"{where} = {result}, expected {config['layers'] // config['pp']} (layers of "
                "1 s each, no TP, no head): an even split must not be refused")
    for config, (kind, result) in zip(configs, pipelines):
        pp, m, v = config["pp"], config["microbatches"], config["v"]
        where = f"pipeline_seconds(pp {pp}, {m} microbatches, v {v}) [{label(config, seed)}]"
        if v > 1 and (pp == 1 or m % pp):
            reason = ("interleaving needs a pipeline (pp > 1)" if pp == 1 else
                      f"interleaved 1F1B runs microbatches in groups of pp: {m} % {pp} = "
                      f"{m % pp}")
            assert kind == "ValueError", f"{where} = {result}: {reason}, so it must raise ValueError"
            numbers = (v,) if pp == 1 else (m, pp)
            for number in numbers:
                assert str(number) in result, (
                    f"{where}'s error {result!r} does not name {number}: {reason}")
        else:
            assert kind == "value", (f"{where} raised ValueError ({result}): this pipeline is "
                                     "valid")


def test_dp_exposed_seconds(impl, run_alone):
    check_function(impl, run_alone, "dp_exposed_seconds")


def test_step_by_hand(impl, run_alone):
    check_hand_cases(impl, run_alone)


def test_step_against_the_planner(impl, run_alone):
    check_planner_step(impl, run_alone)


def test_layouts_that_do_not_divide_are_refused(impl, run_alone, sweep_seed):
    check_refusals(impl, run_alone, sweep_seed)
