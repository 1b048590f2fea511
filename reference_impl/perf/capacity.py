"""The 70B calculation by hand: the numbers a layout decision rests on, one formula each.

The course notes "Week 15 - Tensor Parallelism and Pipeline Parallelism", 15.5: "what TP/PP/DP
degrees do you choose for a 70B model? Document the math." Each function is one term of it, from
its paper: a Llama-style decoder's parameters (Dubey et al. 2024, "The Llama 3 Herd of Models",
Table 3) and those one GPU of the first stage holds; model-state bytes (ZeRO, Rajbhandari et al.
2020, section 3; Megatron-LM's distributed optimizer); activation bytes per layer (Korthikanti
et al. 2022, Table 2, without dropout masks, with flash attention's log-sum-exp); microbatches
in flight under (interleaved) 1F1B (:func:`in_flight_microbatches`, Korthikanti et al. 2022,
section 4.2.3) and the bubble; the TP all-reduces of a layer on a ring (Shoeybi et al. 2019; lab
0's alpha-beta cost); a step from its parts, as the planner adds them
(``perf/planner/time_estimate.py``).

Lab 7's notebook, sections 1 to 3; ``docs/library.md``, "The planner's model, term by term".
"""
from __future__ import annotations

import math

from reference_impl.comm.alpha_beta import ring_all_reduce_seconds
from reference_impl.memory.model_states import zero_memory_formula
from reference_impl.memory.recompute import MODES

TP_ALL_REDUCES_PER_LAYER = 4  # Megatron's TP layer: after attention and the MLP, forward and backward
BACKWARD_SHARE = 2 / 3  # of a stage's time per microbatch: the backward (twice the forward's flops)


def llama_parameters(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
                     gated: bool = True, tied: bool = False) -> int:
    """Weights of a decoder of ``layers`` layers (biases and norms left out): per layer Q and
    the output projection (h x h), K and V (h x kv_heads * h/heads each), the MLP (3 matrices of
    h x ffn when ``gated`` (SwiGLU), else 2); the embedding (vocab x h) and, unless ``tied``,
    an output layer of the same size."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    # BEGIN SOLUTION lab7: llama_parameters (hint: "counting parameters" in the notebook)
    head_size = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_size
    mlp = (3 if gated else 2) * hidden * ffn
    embeddings = (1 if tied else 2) * vocab * hidden
    return layers * (attention + mlp) + embeddings
    # END SOLUTION


def first_stage_parameters(layer_params: float, layers: int, vocab: int, hidden: int,
                           tp: int, pp: int) -> float:
    """Parameters one GPU of the first pipeline stage holds: its stage's layers (``layers`` /
    ``pp``, rounded up) of ``layer_params`` each, and the vocabulary-parallel embedding, all
    split over the ``tp`` GPUs of its TP group."""
    # BEGIN SOLUTION lab7: first_stage_parameters (hint: "model states" in the notebook)
    return (math.ceil(layers / pp) * layer_params + vocab * hidden) / tp
    # END SOLUTION


def model_state_bytes_per_parameter(stage: int, shards: int, accounting: str = "zero") -> float:
    """Bytes of weights, gradients and Adam states per parameter on one GPU, the states sharded
    over ``shards`` data-parallel ranks. ``accounting="zero"``: the ZeRO paper, 2 (bf16 weight)
    + 2 (bf16 gradient) + 12 (fp32 master, m, v), stage 1 shards the 12, stage 2 also the
    gradient, stage 3 everything. ``"megatron"``: Megatron-LM keeps fp32 gradients, 2 + 4 +
    12; stage 1 is its distributed optimizer, sharding the 12 (stages 0 and 1 only)."""
    stages = {"zero": (0, 1, 2, 3), "megatron": (0, 1)}
    if stage not in stages.get(accounting, ()):
        raise ValueError(f"accounting {accounting!r} with ZeRO stage {stage!r}: choose "
                         f"{stages}")
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    if accounting == "zero":
        return zero_memory_formula(1, shards, stage)  # lab 5's count, for one parameter
    # BEGIN SOLUTION lab7: model_state_bytes_per_parameter (hint: "model states" in the notebook)
    weight, gradient, optimizer = 2, 4, 12
    return weight + gradient + (optimizer / shards if stage else optimizer)
    # END SOLUTION


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1,
                               sequence_parallel: bool = False, flash: bool = False,
                               dropout: bool = True) -> float:
    """Korthikanti et al. 2022, Table 2, 16-bit activations: sbh (10 + 24/t + 5as/(ht)) under
    TP, sbh/t (34 + 5as/h) with sequence parallelism too. Of the sbh terms, 2 sbh are 1-byte
    dropout masks (none when not ``dropout``: Llama); the 5as/h term is the scores
    (softmax and dropout outputs, 2 bytes each, and a 1-byte mask: 4 without dropout); with
    ``flash`` attention no scores are kept but one fp32 log-sum-exp per row and head, 4 asb/t
    bytes."""
    # BEGIN SOLUTION lab7: activation_bytes_per_layer (hint: "activations in flight" in the notebook)
    mask = 1 if dropout else 0
    replicated = (8 + 2 * mask) * s * b * h
    if sequence_parallel:
        replicated /= t
    split = 24 * s * b * h / t
    scores = 4 * a * s * b / t if flash else (4 + mask) * a * s * s * b / t
    return replicated + split + scores
    # END SOLUTION


def activation_bytes_with_recompute(s: int, b: int, h: int, a: int, t: int = 1,
                                    sequence_parallel: bool = False, recompute: str | None = None,
                                    flash: bool = False, dropout: bool = True) -> float:
    """Table 2's rows for recomputation (Korthikanti et al. 2022, section 5): selective
    recomputation keeps no scores (the attention core runs again in the backward), full
    recomputation only the layer's input, 2sbh (2sbh/t, the shard, with sequence parallelism)."""
    if recompute not in MODES:
        raise ValueError(f"recompute must be one of {MODES}, got {recompute!r}")
    if recompute == "full":
        return 2 * s * b * h / (t if sequence_parallel else 1)
    heads = a if recompute is None else 0
    return activation_bytes_per_layer(s, b, h, heads, t, sequence_parallel, flash, dropout)


def in_flight_microbatches(pp: int, microbatches: int, v: int = 1) -> float:
    """Microbatches whose activations the first stage holds at once under 1F1B, or under
    interleaved 1F1B with ``v`` model chunks per rank (Korthikanti et al. 2022, section
    4.2.3), never more than there are."""
    # BEGIN SOLUTION lab7: in_flight_microbatches (hint: "activations in flight" in the notebook)
    held = min(pp, microbatches)
    return held * (1 + (pp - 1) / (pp * v)) if v > 1 else held
    # END SOLUTION


def bubble_fraction(pp: int, microbatches: int, v: int = 1) -> float:
    """The idle share of a 1F1B pipeline's step, or of interleaved 1F1B's with ``v`` model
    chunks per rank (Narayanan et al. 2021), the stages equal and the sends free."""
    # BEGIN SOLUTION lab7: bubble_fraction (hint: "the bubble and the pipeline" in the notebook)
    return (pp - 1) / (v * microbatches + pp - 1)
    # END SOLUTION


def tp_all_reduce_bytes_per_layer(b: int, s: int, h: int, bytes_per_element: int = 2) -> int:
    """Bytes all-reduced over a TP group by one layer, forward and backward, for one
    microbatch: 4 all-reduces of the b x s x h activation (or its gradient)."""
    # BEGIN SOLUTION lab7: tp_all_reduce_bytes_per_layer (hint: "TP all-reduces" in the notebook)
    return TP_ALL_REDUCES_PER_LAYER * b * s * h * bytes_per_element
    # END SOLUTION


def tp_seconds_per_layer(b: int, s: int, h: int, tp: int, alpha: float, bandwidth: float,
                         bytes_per_element: int = 2) -> float:
    """Time of one layer's TP all-reduces (one microbatch) on a ring of ``tp`` GPUs with
    latency ``alpha`` seconds and ``bandwidth`` bytes/s: lab 0's alpha-beta cost, each."""
    # BEGIN SOLUTION lab7: tp_seconds_per_layer (hint: "TP all-reduces" in the notebook)
    one = ring_all_reduce_seconds(b * s * h * bytes_per_element, tp, alpha, bandwidth)
    return TP_ALL_REDUCES_PER_LAYER * one
    # END SOLUTION


def stage_seconds(layers: int, pp: int, layer_s: float, tp_s: float, head_s: float = 0.0) -> float:
    """One microbatch through the slowest of ``pp`` pipeline stages, forward and backward: its
    share of the ``layers``, each computing ``layer_s`` and waiting ``tp_s`` for its exposed TP
    collectives, and the LM head (``head_s``) that the last stage also runs. Layers that do not
    split evenly over the stages are refused: the slowest stage then depends on how they are
    balanced (the planner searches that: ``time_estimate.slowest_stage``)."""
    if layers < 1 or pp < 1:
        raise ValueError(f"a pipeline needs layers >= 1 and pp >= 1, got {layers} layers, pp {pp}")
    # BEGIN SOLUTION lab7: stage_seconds (hint: "the bubble and the pipeline" in the notebook)
    if layers % pp:
        raise ValueError(f"{layers} layers do not split evenly over {pp} pipeline stages "
                         f"({layers} % {pp} = {layers % pp}): balance them first "
                         "(the planner's slowest_stage)")
    return layers // pp * (layer_s + tp_s) + head_s
    # END SOLUTION


def pipeline_seconds(stage_s: float, pp: int, microbatches: int, v: int = 1) -> float:
    """A 1F1B pipeline's time for ``microbatches`` microbatches through stages of ``stage_s``
    each (forward and backward); interleaved 1F1B with ``v`` model chunks per rank (Narayanan
    et al. 2021). Its bubble is the excess over ``microbatches`` x ``stage_s``. Megatron-LM's
    interleaved schedule runs the microbatches in groups of ``pp``: other counts are refused,
    and so is interleaving without a pipeline (pp = 1)."""
    if pp < 1 or microbatches < 1 or v < 1:
        raise ValueError(f"a pipeline needs pp, microbatches and v >= 1, got pp {pp}, "
                         f"microbatches {microbatches}, v {v}")
    # BEGIN SOLUTION lab7: pipeline_seconds (hint: "the bubble and the pipeline" in the notebook)
    if v > 1 and pp == 1:
        raise ValueError(f"interleaving (v = {v}) needs a pipeline: pp = 1 has no stages to "
                         "interleave")
    if v > 1 and microbatches % pp:
        raise ValueError(f"interleaved 1F1B runs microbatches in groups of pp = {pp}: "
                         f"{microbatches} microbatches leave {microbatches % pp} over")
    return stage_s * (microbatches + (pp - 1) / v)
    # END SOLUTION


def dp_exposed_seconds(gradient_bytes: float, parameter_bytes: float, dp: int, alpha: float,
                       bandwidth: float, stage_s: float, sharded: bool) -> float:
    """What a step waits for of its data-parallel collectives over ``dp`` ranks on one ring
    (lab 0's cost; latency ``alpha`` s, ``bandwidth`` bytes/s), sent as one bucket each. The
    gradients (``gradient_bytes``) are all-reduced, or reduce-scattered when the optimizer
    is ``sharded`` (ZeRO-1, Megatron-LM's distributed optimizer), overlapped with the last
    microbatch's backward (2/3 of ``stage_s``); a sharded optimizer then all-gathers the
    updated parameters (``parameter_bytes``), overlapped with the next step's first forward
    (1/3 of ``stage_s``). Exposed: what outlasts the compute it overlaps, never below 0.
    A reduce-scatter or an all-gather is half an all-reduce."""
    # BEGIN SOLUTION lab7: dp_exposed_seconds (hint: "DP and the step" in the notebook)
    share = 0.5 if sharded else 1.0  # a reduce-scatter is half an all-reduce
    reduce = share * ring_all_reduce_seconds(gradient_bytes, dp, alpha, bandwidth)
    gather = 0.5 * ring_all_reduce_seconds(parameter_bytes, dp, alpha, bandwidth) if sharded else 0.0
    return (max(0.0, reduce - BACKWARD_SHARE * stage_s)
            + max(0.0, gather - (1 - BACKWARD_SHARE) * stage_s))
    # END SOLUTION


STEP_TERMS = ("layers", "TP", "LM head", "bubble", "DP")


def step_breakdown(layers: int, pp: int, microbatches: int, layer_s: float, tp_s: float,
                   head_s: float, dp_s: float, v: int = 1) -> dict[str, float]:
    """Seconds per step by cause, as the planner's ``TimeEstimate.breakdown`` counts them
    (without recomputation, CP, EP, the framework's time, the sends and the optimizer):
    ``STEP_TERMS`` and ``"step"``, their sum. The slowest stage's layers, their exposed TP
    collectives and the LM head, each once per microbatch; the bubble, what the pipeline
    (:func:`pipeline_seconds`) takes beyond those; the exposed DP time ``dp_s``."""
    # BEGIN SOLUTION lab7: step_breakdown (hint: "DP and the step" in the notebook)
    stage = stage_seconds(layers, pp, layer_s, tp_s, head_s)
    pipeline = pipeline_seconds(stage, pp, microbatches, v)
    per_stage, m = layers // pp, microbatches
    terms = {"layers": m * per_stage * layer_s, "TP": m * per_stage * tp_s,
             "LM head": m * head_s, "bubble": pipeline - m * stage, "DP": dp_s}
    terms["step"] = sum(terms.values())
    return terms
    # END SOLUTION
