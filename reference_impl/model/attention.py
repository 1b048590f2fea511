"""The attention core of the course's models: causal softmax attention of (batch, heads, seq,
head_dim) tensors, the heads split from and merged back into the hidden dimension, and
grouped-query attention's shared KV heads.

The attention core is computed one of two ways, ``ModelConfig.attention`` (the same function,
to fp32 rounding; ``tests/library/tp/test_attention_kernels.py``):

* ``"explicit"`` (the default, the one the labs write and count): the s x s scores are
  materialised, masked and softmaxed, and autograd keeps the softmax, b * heads * s * s
  elements per block, for the backward (``memory/activation_memory.py`` counts them);
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)``,
  which on a GPU runs a fused kernel (FlashAttention or memory-efficient attention) that never
  stores the scores: it keeps q, k, v, the output and one log-sum-exp per row, and recomputes
  the scores block by block in the backward (PyTorch's CPU kernel does the same: per block,
  4 (16 sbh + a s b) + 16 sb bytes saved instead of 4 (16 sbh + a s^2 b) + 16 sb + s^2). The
  scale is the same 1/sqrt(d).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ATTENTION_KERNELS = ("explicit", "sdpa")


def check_attention(attention: str) -> str:
    """``attention`` if it names an attention kernel, else a ValueError naming the choices."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {', '.join(map(repr, ATTENTION_KERNELS))}, "
                         f"got {attention!r}")
    return attention


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, for (batch, heads, seq, head_dim) tensors.

    The softmax runs in fp32 and its probabilities meet v in v's dtype: nothing changes in
    fp32; under bf16 autocast (``precision.py``) it is Megatron-LM's
    ``attention_softmax_in_fp32``, as CUDA's autocast would do anyway (the CPU's would not)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    seq = q.shape[-2]
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    probabilities = scores.masked_fill(future, float("-inf")).float().softmax(dim=-1)
    return probabilities.to(v.dtype) @ v


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attention: str = "explicit") -> torch.Tensor:
    """Causal attention of (batch, heads, seq, head_dim) tensors by the chosen kernel:
    ``"explicit"`` is :func:`causal_attention`, ``"sdpa"`` PyTorch's fused
    ``scaled_dot_product_attention`` (same scale 1/sqrt(d), same causal mask)."""
    if check_attention(attention) == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return causal_attention(q, k, v)


def split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch, seq, 3*heads*d) with [q; k; v] blocks -> q, k, v of shape (batch, heads, seq, d).

    Views of ``qkv``, no copy: their gradients are stacked straight into ``qkv``'s layout in the
    backward (one copy; heads first, then a transpose back, would take two)."""
    batch, seq, _ = qkv.shape
    q, k, v = (part.transpose(1, 2) for part in qkv.view(batch, seq, 3, heads, -1).unbind(2))
    return q, k, v


def check_kv_heads(heads: int, kv_heads: int) -> None:
    """Grouped-query attention's rule: each KV head serves heads / kv_heads query heads."""
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads {kv_heads} does not divide heads {heads}: each KV head "
                         f"serves heads / kv_heads query heads")


def repeat_kv_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention (Ainslie et al. 2023, "GQA"): (batch, kv_heads, seq, d) keys or
    values -> (batch, heads, seq, d), each KV head serving ``heads / kv_heads`` consecutive
    query heads."""
    kv_heads = x.shape[1]
    check_kv_heads(heads, kv_heads)
    return x.repeat_interleave(heads // kv_heads, dim=1)


def heads_of(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, seq, heads*d) -> (batch, heads, seq, d): one projection's heads (the inverse of
    :func:`merge_heads`)."""
    batch, seq, _ = x.shape
    return x.view(batch, seq, heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, d) -> (batch, seq, heads*d)."""
    batch, heads, seq, d = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * d)
