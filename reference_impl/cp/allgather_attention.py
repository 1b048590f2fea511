"""Context parallelism by all-gathering the keys and values (Dubey et al. 2024, "The Llama 3
Herd of Models", section 3.3.2, "Context parallelism").

Instead of passing K/V blocks round a ring, every rank all-gathers the K and V of the whole
sequence over the CP group, with their kv_heads only (with grouped-query attention they are
small next to the queries), and attends its own queries to all of them at once, causal by the
tokens' global positions (the same block attention as the ring's, ``online_softmax.py``; the
gathered keys are in rank order, not sequence order, which the position mask does not mind).
Its backward reduce-scatters dK/dV back to the ranks that hold those tokens.

Against the ring: the same bytes forward ((cp-1) K/V blocks sent per rank), fewer backward
(dK/dV only: the gathered K/V were kept), no overlap by construction (one collective before
the compute), and the whole sequence's K/V kept per rank (``cp_costs.py``). Llama 3 chose it
for its flexibility (any mask, such as document masks) at the cost of exposed latency.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from reference_impl.cp.load_balance import token_positions
from reference_impl.cp.online_softmax import (block_attention, block_attention_backward,
                                              output_dot_grad)
from reference_impl.cp.ring_attention import check_attention_inputs


def _sequence_positions(seq: int, cp: int, device) -> torch.Tensor:
    """The global positions of the gathered tokens, rank 0's first."""
    return torch.cat([token_positions(seq, cp, rank, device) for rank in range(cp)])


class AllGatherAttention(torch.autograd.Function):
    """All-gather K/V forward, reduce-scatter dK/dV backward (see the module's docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, group):
        check_attention_inputs(q, k, v)
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        seq = k.shape[2] * cp
        ctx.group, ctx.seq = group, seq
        with torch.autocast(q.device.type, enabled=False):
            kv = torch.stack((k, v))
            parts = [torch.empty_like(kv) for _ in range(cp)]
            dist.all_gather(parts, kv, group=group)
            # (2, batch, kv_heads, seq, d), the keys in rank order
            kv_all = torch.cat(parts, dim=3)
            out, lse = block_attention(q, kv_all[0], kv_all[1], token_positions(seq, cp, rank, q.device),
                                       _sequence_positions(seq, cp, q.device))
        out = out.to(q.dtype)
        ctx.save_for_backward(q, kv_all, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, kv_all, out, lse = ctx.saved_tensors
        group, seq = ctx.group, ctx.seq
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        with torch.autocast(q.device.type, enabled=False):
            grad_q, grad_k, grad_v = block_attention_backward(
                q, kv_all[0], kv_all[1], grad_out, lse, output_dot_grad(out, grad_out),
                token_positions(seq, cp, rank, q.device), _sequence_positions(seq, cp, q.device))
            # each rank's tokens' dK/dV, summed over the ranks that attended to them
            grad_kv_parts = [part.contiguous() for part in torch.stack((grad_k, grad_v)).chunk(cp, dim=3)]
            grad_kv = torch.empty_like(grad_kv_parts[0])
            dist.reduce_scatter(grad_kv, grad_kv_parts, group=group)
        return grad_q.to(q.dtype), grad_kv[0].to(kv_all.dtype), grad_kv[1].to(kv_all.dtype), None


def allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None) -> torch.Tensor:
    """Causal attention of this rank's queries q (batch, heads, seq/cp, d) over the whole
    sequence, k and v (batch, kv_heads, seq/cp, d) all-gathered over ``group`` (load-balanced
    layout); returns this rank's output, like q. Collective over ``group``."""
    return AllGatherAttention.apply(q, k, v, group)
