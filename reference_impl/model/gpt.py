"""The course's single-device model: a small GPT a reader can hold in their head.

Every parallel component of the course is built *from* these modules' weights (shard-from-full)
and tested against them: they are the oracle. Parameter names are shared with the parallel
versions (``attn.qkv.weight`` is the same tensor, sharded or whole), so a parallel module's
gathered state can be compared with this one's name by name.

    x -> x + attn(ln1(x)) -> x + mlp(ln2(x))        one Block (pre-layernorm)
    attn: qkv (fused, [q; k; v] rows) -> causal softmax(q k^T / sqrt(d)) v per head -> proj
    mlp:  fc1 (hidden -> 4 hidden) -> GeLU -> fc2 (4 hidden -> hidden)

The same ``Block`` and ``GPT`` build a Llama-style model from the options of ``ModelConfig``
(``llama_config()`` sets them all; the parts live in ``llama_blocks.py``):

    norm       "layernorm" | "rmsnorm"      nn.LayerNorm, or RMSNorm (no mean, no bias)
    mlp        "gelu" | "swiglu"            MLP (fc1, fc2), or SwiGLU (gate_up [gate; up], down)
    positions  "learned" | "rotary"         a position embedding, or rotary q and k (no embedding)
    kv_heads   None | a divisor of heads    grouped-query attention's KV heads (None: = heads)
    bias       True | False                 biases in the linear layers and the layernorms
    ffn_hidden None | a size                the MLP's inner size (None: ffn_multiple * hidden)

With rotary positions or fewer KV heads than heads, the attention is
``llama_blocks.GroupedQueryAttention`` (q, k, v and proj weights); otherwise the GPT's
``CausalSelfAttention``. The defaults are the GPT above, its parameters and numerics unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from reference_impl.model import llama_blocks
from reference_impl.model.attention import (attention_core, check_attention,
                                            check_kv_heads, merge_heads, split_heads)


NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rotary")
SWIGLU_FFN_MULTIPLE_OF = 16  # llama_ffn_hidden rounds up to it (Llama rounds to 256)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 64
    seq_len: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    ffn_multiple: int = 4
    attention: str = "explicit"  # "explicit" (s x s scores kept) or "sdpa" (a fused kernel)
    norm: str = "layernorm"  # or "rmsnorm"
    mlp: str = "gelu"  # or "swiglu"
    positions: str = "learned"  # or "rotary"
    kv_heads: int | None = None  # grouped-query attention's KV heads; None: as many as heads
    bias: bool = True  # biases in the linear layers and the layernorms
    ffn_hidden: int | None = None  # the MLP's inner size; None: ffn_multiple * hidden

    def __post_init__(self):
        check_attention(self.attention)
        for name, choices in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got "
                                 f"{getattr(self, name)!r}")
        for name in ("kv_heads", "ffn_hidden"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
        if self.kv_heads is not None:
            check_kv_heads(self.heads, self.kv_heads)
        if self.positions == "rotary" and (self.hidden % self.heads or self.head_dim % 2):
            raise ValueError(f"rotary positions turn pairs of a head's features: hidden "
                             f"{self.hidden} / heads {self.heads} must be a whole, even head_dim")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_size(self) -> int:
        """The MLP's inner size: ``ffn_hidden``, else ``ffn_multiple * hidden``."""
        return self.ffn_hidden or self.ffn_multiple * self.hidden

    @property
    def grouped_query_attention(self) -> bool:
        """Whether the blocks' attention is ``llama_blocks.GroupedQueryAttention`` (rotary
        positions, or fewer KV heads than heads) rather than ``CausalSelfAttention``."""
        return self.positions == "rotary" or self.kv_heads not in (None, self.heads)


def llama_ffn_hidden(hidden: int, ffn_multiple: int = 4) -> int:
    """The SwiGLU's inner size: 2/3 of the GeLU MLP's ``ffn_multiple * hidden``, so that its
    three matrices hold the GeLU MLP's two matrices' parameters (Shazeer 2020, as Llama does),
    rounded up to a multiple of :data:`SWIGLU_FFN_MULTIPLE_OF`: hidden 16 -> 48, 32 -> 96."""
    step = 3 * SWIGLU_FFN_MULTIPLE_OF
    return -(-2 * ffn_multiple * hidden // step) * SWIGLU_FFN_MULTIPLE_OF


def llama_config(**overrides) -> ModelConfig:
    """A Llama-style ``ModelConfig``: RMSNorm, SwiGLU, rotary positions, no biases, ``kv_heads``
    = heads // 2 (at least 1) and ``ffn_hidden`` = :func:`llama_ffn_hidden` of the hidden size,
    unless ``overrides`` (any ``ModelConfig`` field) say otherwise."""
    fields = dict(norm="rmsnorm", mlp="swiglu", positions="rotary", bias=False) | overrides
    fields.setdefault("kv_heads", max(1, fields.get("heads", ModelConfig.heads) // 2))
    fields.setdefault("ffn_hidden", llama_ffn_hidden(fields.get("hidden", ModelConfig.hidden),
                                                     fields.get("ffn_multiple",
                                                                ModelConfig.ffn_multiple)))
    return ModelConfig(**fields)


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn_hidden: int, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden, bias=bias)
        self.fc2 = nn.Linear(ffn_hidden, hidden, bias=bias)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, attention: str = "explicit", bias: bool = True):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by heads = {heads}")
        self.heads = heads
        self.attention = check_attention(attention)  # the kernel: "explicit" or "sdpa"
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x):
        q, k, v = split_heads(self.qkv(x), self.heads)
        return self.proj(merge_heads(attention_core(q, k, v, self.attention)))


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return llama_blocks.RMSNorm(config.hidden)
    return nn.LayerNorm(config.hidden, bias=config.bias)


def make_attention(config: ModelConfig) -> nn.Module:
    if config.grouped_query_attention:
        return llama_blocks.GroupedQueryAttention(
            config.hidden, config.heads, config.kv_heads, rotary=config.positions == "rotary",
            attention=config.attention, bias=config.bias)
    return CausalSelfAttention(config.hidden, config.heads, config.attention, bias=config.bias)


def make_mlp(config: ModelConfig) -> nn.Module:
    if config.mlp == "swiglu":
        return llama_blocks.SwiGLU(config.hidden, config.ffn_size, bias=config.bias)
    return MLP(config.hidden, config.ffn_size, bias=config.bias)


class Block(nn.Module):
    """Pre-norm: x + attn(ln1(x)), then + mlp(ln2(x)); the parts as ``config`` picks them."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln1 = make_norm(config)
        self.attn = make_attention(config)
        self.ln2 = make_norm(config)
        self.mlp = make_mlp(config)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final layernorm and the LM head.
    With rotary positions there is no position embedding (``position_embedding`` is None)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden)
        self.position_embedding = (nn.Embedding(config.seq_len, config.hidden)
                                   if config.positions == "learned" else None)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def hidden_states(self, tokens):
        """The final layernorm's output: what the LM head turns into logits."""
        x = self.token_embedding(tokens)
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, tokens):
        return self.lm_head(self.hidden_states(tokens))
