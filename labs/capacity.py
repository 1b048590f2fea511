# Student file for the labs, generated from reference_impl/perf/capacity.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""The 70B calculation by hand: the numbers a layout decision rests on, one formula each.

The course notes "Week 15 - Tensor Parallelism and Pipeline Parallelism", 15.5: "for your
hardware, what TP/PP/DP degrees do you choose for a 70B model? Document the math." Each
function is one term of that math, written from the paper that states it; the planner
(``reference_impl/perf/planner/``) computes the same terms for every layout it tries.

* parameters of a Llama-style decoder: attention with grouped-query K and V, a SwiGLU
  (gated) or plain MLP, the embedding and, unless tied, the output layer (Dubey et al. 2024,
  "The Llama 3 Herd of Models", Table 3 for the shapes);
* the parameters one GPU of the first pipeline stage holds under TP and PP;
* model-state bytes per parameter with mixed-precision Adam: the ZeRO paper's stages
  (Rajbhandari et al. 2020, section 3) and Megatron-LM's distributed optimizer (fp32 gradients);
* activation bytes per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", Table 2), without dropout masks for models without dropout and
  with flash attention's log-sum-exp in place of the s x s scores;
* microbatches in flight on the first stage under 1F1B, and interleaved 1F1B's extra factor
  (Korthikanti et al. 2022, section 4.2.3); the pipeline bubble (Narayanan et al. 2021);
* the TP all-reduces of one layer: 2 in the forward and 2 in the backward (Shoeybi et al.
  2019, "Megatron-LM"), and their time on a ring (lab 0's alpha-beta cost).
"""
from __future__ import annotations

import math

from reference_impl.comm.alpha_beta import ring_all_reduce_seconds

TP_ALL_REDUCES_PER_LAYER = 4  # Megatron's TP layer: after attention and the MLP, forward and backward


def llama_parameters(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
                     gated: bool = True, tied: bool = False) -> int:
    """Weights of a decoder of ``layers`` layers (biases and norms left out): per layer Q and
    the output projection (h x h), K and V (h x kv_heads * h/heads each), the MLP (3 matrices of
    h x ffn when ``gated`` (SwiGLU), else 2); the embedding (vocab x h) and, unless ``tied``,
    an output layer of the same size."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    raise NotImplementedError('lab7: per layer, attention = Q and output (h x h each) + K and V (h x kv_heads * head size each); MLP = (3 if gated else 2) matrices of h x ffn; then the embedding, counted twice unless tied')


def first_stage_parameters(layer_params: float, layers: int, vocab: int, hidden: int,
                           tp: int, pp: int) -> float:
    """Parameters one GPU of the first pipeline stage holds: its stage's layers (``layers`` /
    ``pp``, rounded up) of ``layer_params`` each, and the vocabulary-parallel embedding, all
    split over the ``tp`` GPUs of its TP group."""
    raise NotImplementedError('lab7: ceil(layers / pp) layers, each split tp ways, plus the embedding (vocab x hidden) split tp ways')


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
    raise NotImplementedError('lab7: the weight, gradient and optimizer bytes of the accounting; the kinds the stage shards count / shards, the others whole')


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1,
                               sequence_parallel: bool = False, flash: bool = False,
                               dropout: bool = True) -> float:
    """Korthikanti et al. 2022, Table 2, 16-bit activations: sbh (10 + 24/t + 5as/(ht)) under
    TP, sbh/t (34 + 5as/h) with sequence parallelism too. Of the sbh terms, 2 sbh are 1-byte
    dropout masks (none when not ``dropout``: Llama); the 5as/h term is the scores
    (softmax and dropout outputs, 2 bytes each, and a 1-byte mask: 4 without dropout); with
    ``flash`` attention no scores are kept but one fp32 log-sum-exp per row and head, 4 asb/t
    bytes."""
    raise NotImplementedError("lab7: the sbh part: 10 + 24/t (of which the 2 mask bytes are replicated), all of it / t with SP; drop the 2 mask bytes without dropout; add the scores (2 + 2 + mask) a s^2 b / t, or flash's 4 a s b / t")


def in_flight_microbatches(pp: int, microbatches: int, v: int = 1) -> float:
    """Microbatches whose activations the first stage holds at once: 1F1B keeps at most ``pp``
    (and never more than there are), interleaved 1F1B with ``v`` chunks per rank a factor
    1 + (pp - 1) / (pp v) more."""
    raise NotImplementedError('lab7: min(pp, microbatches), times 1 + (pp-1)/(pp v) when interleaved (v > 1)')


def bubble_fraction(pp: int, microbatches: int, v: int = 1) -> float:
    """The idle share of a 1F1B pipeline's step, (p-1)/(m+p-1); interleaved with ``v`` chunks
    per rank, (p-1)/(vm+p-1) (Narayanan et al. 2021)."""
    raise NotImplementedError('lab7: p - 1 idle slots of a makespan of v m + p - 1 slots')


def tp_all_reduce_bytes_per_layer(b: int, s: int, h: int, bytes_per_element: int = 2) -> int:
    """Bytes all-reduced over a TP group by one layer, forward and backward, for one
    microbatch: 4 all-reduces of the b x s x h activation (or its gradient)."""
    raise NotImplementedError('lab7: 4 all-reduces of a b x s x h tensor of bytes_per_element each')


def tp_seconds_per_layer(b: int, s: int, h: int, tp: int, alpha: float, bandwidth: float,
                         bytes_per_element: int = 2) -> float:
    """Time of one layer's TP all-reduces (one microbatch) on a ring of ``tp`` GPUs with
    latency ``alpha`` seconds and ``bandwidth`` bytes/s: lab 0's alpha-beta cost, each."""
    raise NotImplementedError('lab7: 4 ring all-reduces, each of b s h bytes_per_element bytes over tp GPUs')
