"""Self-attention with context parallelism: the layer a CP rank runs on its tokens.

:class:`ContextParallelAttention` is ``llama_blocks.GroupedQueryAttention`` on one rank of a CP
group: replicated projections and rotary embeddings at the tokens' global positions on this
rank's load-balanced tokens, ring attention (or the all-gather variant) for the causal core.
The replicated weights' gradients sum over the CP group (:func:`sync_context_parallel_grads`, or
the data-parallel reduction over dp x cp in training). Data flow: docs/library.md, 'Beyond the
three dimensions'.
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
from reference_impl.model.attention import merge_heads
from reference_impl.model.llama_blocks import GroupedQueryAttention


class ContextParallelAttention(GroupedQueryAttention):
    """``attention``'s layer (a copy of its weights, under the same names) on this rank of the
    CP ``group`` (None: the world); ``variant`` "ring" or "allgather". Input and output: this
    rank's tokens (batch, seq/cp, hidden), load-balanced. After the backward, call
    :func:`sync_context_parallel_grads` (or reduce the gradients over DP x CP).

    ``attention`` is a ``llama_blocks.GroupedQueryAttention`` (grouped-query heads, rotary
    embeddings, q, k, v and proj weights); the ring replaces its attention kernel. With
    ``copy_weights=False`` the layer uses ``attention``'s q, k, v and proj modules themselves
    (a model being parallelised hands over its own)."""

    def __init__(self, attention: GroupedQueryAttention, group=None, variant: str = "ring",
                 copy_weights: bool = True):
        nn.Module.__init__(self)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}")
        self.heads, self.kv_heads = attention.heads, attention.kv_heads
        self.rotary, self.attention = attention.rotary, attention.attention
        for name in ("q", "k", "v", "proj"):  # copy_weights=False: take the modules themselves
            module = getattr(attention, name)
            setattr(self, name, copy.deepcopy(module) if copy_weights else module)
        self.group, self.variant = group, variant

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """What the projections are applied to: ``x`` itself (a tensor-parallel subclass
        enters its TP region here, ``hybrid/context_parallel.py``)."""
        return x

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
        x = self.enter(x)
        q, k, v = self.project(x, self.positions(x))
        return self.proj(merge_heads(self.core(q, k, v, clock)))


def sync_context_parallel_grads(module: nn.Module, group=None) -> None:
    """Sum every parameter's gradient over the CP ``group``: each rank's covers its own tokens.
    Call after the backward, before the optimizer step; collective. (In training, the
    data-parallel reduction over DP x CP does this sum: ``hybrid/parallelize.py``.)"""
    for parameter in module.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, group=group)
