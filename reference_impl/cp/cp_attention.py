"""Self-attention with context parallelism: the layer a CP rank runs on its tokens.

:class:`RotaryAttention` is the single-device layer, written the Llama way (separate q, k, v
projections, grouped-query attention with ``kv_heads`` KV heads, rotary embeddings on q and k,
``rotary.py``) with the course's causal attention core (``model.causal_attention``).
:class:`ContextParallelAttention` is the same layer on one rank of a context-parallel group:

    x_r (batch, seq/cp, hidden), this rank's tokens in the load-balanced layout (load_balance.py)
    -> q, k, v projections (whole weights, replicated over the CP group)
    -> rotary embeddings with the tokens' *global* positions
    -> ring attention (or the all-gather variant): causal over the whole sequence
    -> output projection                         -> this rank's tokens' outputs

Everything but the attention core is per token, so it runs on the rank's tokens as it would
on one device. **Gradient sync.** The projections' weights are replicated, and each rank's
gradient covers its own tokens only: the sum over the CP group is the single-device gradient.
:func:`sync_context_parallel_grads` sums them. In a training run, the same sum is done by the
data-parallel gradient reduction instead, when the CP ranks join it: Megatron-core reduces the
gradients over the data-parallel x context-parallel group (each CP rank counts as one more
data shard holding part of every sample).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.cp.allgather_attention import allgather_attention
from reference_impl.cp.cp_costs import VARIANTS
from reference_impl.cp.load_balance import token_positions
from reference_impl.cp.ring_attention import ring_attention
from reference_impl.hybrid.data_parallel import all_reduce_mean
from reference_impl.model import causal_attention, merge_heads, repeat_kv_heads
from reference_impl.rotary import apply_rotary


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, seq, heads*d) -> (batch, heads, seq, d)."""
    batch, seq, _ = x.shape
    return x.view(batch, seq, heads, -1).transpose(1, 2)


class RotaryAttention(nn.Module):
    """Causal self-attention with grouped-query heads and rotary embeddings, on one device."""

    def __init__(self, hidden: int, heads: int, kv_heads: int | None = None, bias: bool = True):
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by heads = {heads}")
        if heads % kv_heads:
            raise ValueError(f"kv_heads {kv_heads} does not divide heads {heads}")
        self.heads, self.kv_heads, self.rotary = heads, kv_heads, True
        head_dim = hidden // heads
        self.q = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """q (batch, heads, seq, d), k and v (batch, kv_heads, seq, d) of tokens ``x`` at
        ``positions``, q and k turned by them."""
        q, k = _split_heads(self.q(x), self.heads), _split_heads(self.k(x), self.kv_heads)
        if self.rotary:
            q, k = apply_rotary(q, positions), apply_rotary(k, positions)
        return q, k, _split_heads(self.v(x), self.kv_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x, torch.arange(x.shape[1], device=x.device))
        out = causal_attention(q, repeat_kv_heads(k, self.heads), repeat_kv_heads(v, self.heads))
        return self.proj(merge_heads(out))


class ContextParallelAttention(RotaryAttention):
    """``attention``'s layer (a copy of its weights, under the same names) on this rank of the
    CP ``group`` (None: the world); ``variant`` "ring" or "allgather". Input and output: this
    rank's tokens (batch, seq/cp, hidden), load-balanced. After the backward, call
    :func:`sync_context_parallel_grads` (or reduce the gradients over DP x CP).

    ``attention`` is a :class:`RotaryAttention` or any layer laid out the same way: ``heads``,
    ``kv_heads``, linear ``q``, ``k``, ``v``, ``proj`` and optionally ``rotary`` (a bool,
    True when absent), such as ``llama_blocks.GroupedQueryAttention``."""

    def __init__(self, attention: RotaryAttention, group=None, variant: str = "ring"):
        nn.Module.__init__(self)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}")
        self.heads, self.kv_heads = attention.heads, attention.kv_heads
        self.rotary = getattr(attention, "rotary", True)
        for name in ("q", "k", "v", "proj"):
            setattr(self, name, copy.deepcopy(getattr(attention, name)))
        self.group, self.variant = group, variant

    def positions(self, x: torch.Tensor) -> torch.Tensor:
        """The global positions of this rank's tokens ``x`` (batch, seq/cp, hidden)."""
        cp, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        return token_positions(x.shape[1] * cp, cp, rank, x.device)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, clock=None) -> torch.Tensor:
        """The attention core over the CP group: ring (timed by ``clock``, a ``RingClock``,
        if given) or all-gather."""
        if self.variant == "ring":
            return ring_attention(q, k, v, self.group, clock)
        return allgather_attention(q, k, v, self.group)

    def forward(self, x: torch.Tensor, clock=None) -> torch.Tensor:
        q, k, v = self.project(x, self.positions(x))
        return self.proj(merge_heads(self.core(q, k, v, clock)))


def sync_context_parallel_grads(module: nn.Module, group=None) -> None:
    """Sum every parameter's gradient over the CP ``group`` (coalesced all-reduces): each rank's
    covers its own tokens. Call after the backward, before the optimizer step; collective."""
    grads = [parameter.grad for parameter in module.parameters() if parameter.grad is not None]
    all_reduce_mean(grads, group, divisor=1)
