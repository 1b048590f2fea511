"""The course's single-device model: a small GPT a reader can hold in their head.

Every parallel component of the course is built *from* these modules' weights (shard-from-full)
and tested against them: they are the oracle. Parameter names are shared with the parallel
versions (``attn.qkv.weight`` is the same tensor, sharded or whole), so a parallel module's
gathered state can be compared with this one's name by name.

    x -> x + attn(ln1(x)) -> x + mlp(ln2(x))        one Block (pre-layernorm)
    attn: qkv (fused, [q; k; v] rows) -> causal softmax(q k^T / sqrt(d)) v per head -> proj
    mlp:  fc1 (hidden -> 4 hidden) -> GeLU -> fc2 (4 hidden -> hidden)

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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


ATTENTION_KERNELS = ("explicit", "sdpa")


def check_attention(attention: str) -> str:
    """``attention`` if it names an attention kernel, else a ValueError naming the choices."""
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {', '.join(map(repr, ATTENTION_KERNELS))}, "
                         f"got {attention!r}")
    return attention


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 64
    seq_len: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    ffn_multiple: int = 4
    attention: str = "explicit"  # "explicit" (s x s scores kept) or "sdpa" (a fused kernel)

    def __post_init__(self):
        check_attention(self.attention)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


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
    """(batch, seq, 3*heads*d) with [q; k; v] blocks -> q, k, v of shape (batch, heads, seq, d)."""
    batch, seq, _ = qkv.shape
    q, k, v = qkv.view(batch, seq, 3, heads, -1).permute(2, 0, 3, 1, 4)
    return q, k, v


def repeat_kv_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention (Ainslie et al. 2023, "GQA"): (batch, kv_heads, seq, d) keys or
    values -> (batch, heads, seq, d), each KV head serving ``heads / kv_heads`` consecutive
    query heads."""
    kv_heads = x.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly: heads "
                         f"must be a multiple of kv_heads")
    return x.repeat_interleave(heads // kv_heads, dim=1)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, d) -> (batch, seq, heads*d)."""
    batch, heads, seq, d = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * d)


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, attention: str = "explicit"):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by heads = {heads}")
        self.heads = heads
        self.attention = check_attention(attention)  # the kernel: "explicit" or "sdpa"
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        q, k, v = split_heads(self.qkv(x), self.heads)
        return self.proj(merge_heads(attention_core(q, k, v, self.attention)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden)
        self.attn = CausalSelfAttention(config.hidden, config.heads, config.attention)
        self.ln2 = nn.LayerNorm(config.hidden)
        self.mlp = MLP(config.hidden, config.ffn_multiple * config.hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final layernorm and the LM head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden)
        self.position_embedding = nn.Embedding(config.seq_len, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.hidden)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
