"""The Llama-style parts of a block, single-device: what ``model.Block`` picks when
``ModelConfig`` asks for them (``model.llama_config`` asks for all of them).

:class:`RMSNorm` (Zhang & Sennrich 2019), :class:`SwiGLU` (Shazeer 2020, "GLU Variants Improve
Transformer"; its gate and up projections one fused ``gate_up`` weight) and
:class:`GroupedQueryAttention` (rotary embeddings, Su et al. 2021, "RoFormer"; Ainslie et al.
2023, "GQA"; q, k and v kept as three weights so TP can split them in equal pieces). Formulas
and why: docs/library.md, 'Beyond the three dimensions'.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference_impl.model.attention import (attention_core, check_attention, check_kv_heads, heads_of,
                                      merge_heads, repeat_kv_heads)
from reference_impl.model.rotary import apply_rotary

RMS_NORM_EPS = 1e-5  # Llama 2's; nn.LayerNorm's default eps too


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension: a layernorm without the mean
    subtracted and without a bias (Zhang & Sennrich 2019). Computed in fp32, returned in x's
    dtype (so under bf16 autocast the statistics are fp32, as Llama computes them)."""

    def __init__(self, hidden: int, eps: float = RMS_NORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    """The gated MLP: ``gate_up`` (hidden -> 2 ffn, rows [gate; up]), silu(gate) * up, ``down``
    (ffn -> hidden)."""

    def __init__(self, hidden: int, ffn_hidden: int, bias: bool = False):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * ffn_hidden, bias=bias)
        self.down = nn.Linear(ffn_hidden, hidden, bias=bias)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      attention: str = "explicit") -> torch.Tensor:
    """Causal attention of q (batch, heads, seq, d) over k and v (batch, kv_heads, seq, d):
    each KV head repeated for the query heads that share it, then the GPT's attention core."""
    heads = q.shape[1]
    return attention_core(q, repeat_kv_heads(k, heads), repeat_kv_heads(v, heads), attention)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with ``kv_heads`` KV heads and, with ``rotary``, rotary embeddings
    on q and k at positions 0..s-1 (without it, the positions come from the GPT's learned
    embedding). ``kv_heads == heads`` is the GPT's multi-head attention."""

    def __init__(self, hidden: int, heads: int, kv_heads: int | None = None, rotary: bool = True,
                 attention: str = "explicit", bias: bool = False):
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by heads = {heads}")
        check_kv_heads(heads, kv_heads)
        head_dim = hidden // heads
        if rotary and head_dim % 2:
            raise ValueError(f"rotary embeddings turn pairs of features: head_dim {head_dim} "
                             f"(hidden {hidden} / heads {heads}) is odd")
        self.heads, self.kv_heads, self.rotary = heads, kv_heads, rotary
        self.attention = check_attention(attention)  # the kernel: "explicit" or "sdpa"
        self.q = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.proj = nn.Linear(heads * head_dim, hidden, bias=bias)

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None):
        """The projections of tokens ``x``: q (batch, heads, seq, d), k and v (batch, kv_heads,
        seq, d), q and k turned by the tokens' ``positions`` with ``rotary`` (default 0..s-1, the
        whole sequence's; a context-parallel rank passes its tokens' places in the sequence)."""
        q, k, v = (heads_of(self.q(x), self.heads), heads_of(self.k(x), self.kv_heads),
                   heads_of(self.v(x), self.kv_heads))
        if self.rotary:
            if positions is None:
                positions = torch.arange(q.shape[-2], device=q.device)
            q, k = apply_rotary(q, positions), apply_rotary(k, positions)
        return q, k, v

    def forward(self, x):
        q, k, v = self.project(x)
        return self.proj(merge_heads(grouped_attention(q, k, v, self.attention)))
