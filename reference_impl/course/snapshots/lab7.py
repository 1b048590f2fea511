"""Lab 7's expected values: every term of the 70B calculation, on the cases its checks try.

``<function>/<set>``: a list of (args, kwargs, value) with the value the reference's
``capacity.<function>`` gives (``set``: "public" for the graded checks, "hidden" for the
grader's). ``planner/<set>``: layouts the planner evaluates, each a dict of the inputs a step's
composition takes from the planner (model_layers, pp, microbatches, v, layer_s, tp_s (exposed),
head_s, dp_s) and what the planner makes of them (stage_s, pipeline_s, and its breakdown's
layers, TP, LM head, bubble and DP terms); ``tp_comm/<set>``: the planner's time of one layer's
TP collectives (``TimeEstimate.tp_comm_s``) with the arguments that give it.
"""
from __future__ import annotations

from reference_impl.perf import capacity
from reference_impl.perf.planner import Layout, cluster_of, evaluate, get_model

PRESETS = ("70b", "7b", "405b", "gpt3-175b")  # the planner's dense models
SHAPES = [  # (layers, hidden, heads, kv_heads, ffn, vocab), gated, tied: other shapes
    ((32, 4096, 32, 32, 11008, 32000), {"gated": True, "tied": False}),   # Llama 2 7B
    ((22, 2048, 32, 4, 5632, 32000), {"gated": True, "tied": True}),      # GQA, tied
    ((12, 768, 12, 12, 3072, 50257), {"gated": False, "tied": True}),     # GPT-2 small
    ((40, 5120, 40, 8, 13824, 65536), {"gated": False, "tied": False}),  # GQA, plain MLP
]
ACTIVATIONS = {  # (s, b, h, a, t, sequence_parallel, flash, dropout)
    "public": [(4096, 1, 8192, 64, 8, True, True, False), (2048, 2, 4096, 32, 4, False, False, True),
               (2048, 2, 4096, 32, 4, True, False, True), (1024, 4, 2048, 16, 1, False, False, True),
               (1024, 4, 2048, 16, 2, False, True, False), (4096, 1, 8192, 64, 8, True, False, False)],
    "hidden": [(8192, 1, 16384, 128, 8, True, True, False), (512, 3, 1536, 12, 3, False, False, True),
               (512, 3, 1536, 12, 3, True, True, True), (2048, 1, 5120, 40, 2, False, False, False)],
}
FIRST_STAGE = {"public": [(8, 4), (2, 8), (1, 16), (4, 3), (8, 1)],
               "hidden": [(4, 7), (2, 6), (1, 5), (8, 2)]}
STATES = {"public": [(stage, shards, "zero") for stage in (0, 1, 2, 3) for shards in (1, 4, 6)]
          + [(stage, shards, "megatron") for stage in (0, 1) for shards in (1, 4, 6)],
          "hidden": [(stage, shards, "zero") for stage in (1, 2, 3) for shards in (3, 7, 64)]
          + [(1, shards, "megatron") for shards in (3, 7, 64)]}
PIPELINES = {"public": [(4, 256, 1), (8, 32, 5), (8, 4, 1), (4, 2, 2), (1, 8, 1), (16, 64, 4)],
             "hidden": [(2, 1, 1), (6, 18, 3), (3, 2, 1), (12, 24, 2), (5, 5, 5)]}
TP_VOLUMES = {"public": [((1, 4096, 8192), {}), ((2, 1024, 512), {"bytes_per_element": 4})],
              "hidden": [((3, 2048, 5120), {}), ((1, 100, 7), {"bytes_per_element": 1})]}
TP_TIMES = {"public": [((2, 1024, 512, 4, 1e-5, 1e10), {"bytes_per_element": 4})],
            "hidden": [((1, 333, 1024, 3, 2e-6, 5e10), {}), ((4, 64, 64, 1, 1e-5, 1e9), {})]}
DP = {  # (gradient_bytes, parameter_bytes, dp, alpha, bandwidth, stage_s, sharded)
    "public": [(4 * 2.2e9, 2 * 2.2e9, 4, 5e-6, 40e9, 0.15, True), (2e9, 1e9, 8, 1e-5, 25e9, 0.3, False),
               (4e8, 2e8, 2, 1e-5, 50e9, 0.5, True), (2e10, 1e8, 8, 1e-5, 40e9, 0.3, True)],
    "hidden": [(8e9, 4e9, 16, 2e-5, 40e9, 0.05, True), (1e9, 5e8, 1, 1e-5, 40e9, 0.1, True),
               (6e9, 3e9, 64, 8e-6, 12.5e9, 1.0, False)],
}
LAYOUTS = {  # (tp, pp, dp, v) of the 70B model on 16 x 8 H100s, 1024 sequences a step
    "public": [(8, 4, 4, 1), (2, 4, 16, 2), (2, 8, 8, 1)],
    "hidden": [(4, 8, 4, 5), (8, 1, 16, 1), (4, 4, 8, 2), (1, 16, 8, 1)],
}
GLOBAL_BATCH = 1024


def values(function, calls) -> list:
    return [(args, kwargs, getattr(capacity, function)(*args, **kwargs)) for args, kwargs in calls]


def spec_arguments(model):
    return ((model.layers, model.hidden, model.heads, model.kv_heads or model.heads, model.ffn,
             model.vocab), {"gated": model.gated_mlp, "tied": model.tied_embeddings})


def planner_terms(layouts) -> list[dict]:
    model = get_model("70b")
    cluster = cluster_of("h100", nodes=16, gpus_per_node=8)
    found = []
    for tp, pp, dp, v in layouts:
        time = evaluate(model, cluster, Layout(tp, pp, dp, v=v), GLOBAL_BATCH).time
        terms = time.breakdown()
        found.append({"layout": f"TP {tp} x PP {pp} x DP {dp}, v {v}", "model_layers": model.layers,
                      "pp": pp, "microbatches": time.microbatches, "v": v,
                      "layer_s": time.layer_s, "tp_s": time.tp_exposed_s, "head_s": time.head_s,
                      "dp_s": time.dp_s, "stage_s": time.stage_s, "pipeline_s": time.pipeline_s,
                      **{name: terms[name] for name in capacity.STEP_TERMS}})
    return found


def tp_comm(tps) -> list:
    model = get_model("70b")
    cluster = cluster_of("h100", nodes=16, gpus_per_node=8)
    found = []
    for tp in tps:
        time = evaluate(model, cluster, Layout(tp, 128 // (tp * 4), 4), GLOBAL_BATCH).time
        found.append(((1, model.seq_len, model.hidden, tp, cluster.intra_alpha,
                       cluster.intra_bw_gbs * 1e9), {}, time.tp_comm_s))
    return found


def make() -> dict:
    return {**made_for("public"), "tp_comm/public": tp_comm((8, 2))}


def make_hidden() -> dict:
    return {**made_for("hidden"), "tp_comm/hidden": tp_comm((4, 1))}


def made_for(name: str) -> dict:
    """Every function's values on the ``name`` set of cases ("public" or "hidden")."""
    made = {}
    shapes = ([spec_arguments(get_model(preset)) for preset in PRESETS]
              if name == "public" else SHAPES)
    made[f"llama_parameters/{name}"] = values("llama_parameters", shapes)
    seventy = get_model("70b")
    made[f"first_stage_parameters/{name}"] = values("first_stage_parameters", [
        ((seventy.params_per_layer, seventy.layers, seventy.vocab, seventy.hidden, tp, pp), {})
        for tp, pp in FIRST_STAGE[name]])
    made[f"model_state_bytes_per_parameter/{name}"] = values(
        "model_state_bytes_per_parameter", [(case, {}) for case in STATES[name]])
    made[f"activation_bytes_per_layer/{name}"] = values("activation_bytes_per_layer", [
        ((s, b, h, a, t), {"sequence_parallel": sp, "flash": flash, "dropout": dropout})
        for s, b, h, a, t, sp, flash, dropout in ACTIVATIONS[name]])
    for function in ("in_flight_microbatches", "bubble_fraction"):
        made[f"{function}/{name}"] = values(function, [(case, {}) for case in PIPELINES[name]])
    made[f"tp_all_reduce_bytes_per_layer/{name}"] = values("tp_all_reduce_bytes_per_layer",
                                                           TP_VOLUMES[name])
    made[f"tp_seconds_per_layer/{name}"] = values("tp_seconds_per_layer", TP_TIMES[name])
    made[f"dp_exposed_seconds/{name}"] = values("dp_exposed_seconds",
                                                [(case, {}) for case in DP[name]])
    made[f"planner/{name}"] = planner_terms(LAYOUTS[name])
    return made
