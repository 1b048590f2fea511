"""Ring attention: causal self-attention over a sequence split across a context-parallel group
(Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context").

Each rank holds the queries, keys and values of its tokens in the load-balanced layout
(``load_balance.py``). Queries stay; the K/V blocks (with their kv_heads only) travel round the
ring, rank r sending to r+1 while it attends its queries to the visible part of the block it
holds and merges the result (``online_softmax.py``), so the transfer overlaps the compute. The
backward sends the blocks round again, dQ staying home and each block's dK/dV following it one
hop behind back to its owner (:func:`backward_step`); nothing of size seq x seq outlives a step.

The derivations: lab 8's notebook, "3. The load-balanced layout", "4. The ring" and "4b. The
ring's backward: dK and dV travel home"; the bytes and memory: ``docs/library.md``, "Beyond
the three dimensions" (context parallelism).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as distributed_c10d

from reference_impl.model.attention import check_kv_heads
from reference_impl.cp.load_balance import token_positions, visible_part
from reference_impl.cp.online_softmax import (block_attention, block_attention_backward,
                                              merge_partials, output_dot_grad)
from reference_impl.cp.ring_overlap import RingClock

KV_TAG, GRAD_KV_TAG = 0, 1


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError unless q is (batch, heads, seq_local, d) and k, v (batch, kv_heads,
    seq_local, d) with kv_heads dividing heads and seq_local even (two chunks)."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim) with k and v alike: got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    (batch, heads, seq, dim), kv_heads = q.shape, k.shape[1]
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, dim):
        raise ValueError(f"k and v {tuple(k.shape)} must match q {tuple(q.shape)} in batch, seq "
                         "and head_dim")
    check_kv_heads(heads, kv_heads)
    if seq % 2:
        raise ValueError(f"the load-balanced layout gives each rank 2 equal chunks: this rank's "
                         f"seq {seq} is odd")


class _Transfer:
    """A posted ring exchange: wait() returns the received tensor."""

    def __init__(self, received: torch.Tensor, works: list):
        self.received, self.works = received, works

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.received


def start_ring_exchange(tensor: torch.Tensor, group, tag: int) -> _Transfer:
    """Send ``tensor`` to the next rank of the ring and receive one like it from the previous
    one, posted together (one ``batch_isend_irecv``), not waited for. Group ranks are
    translated to global ranks, as ``P2POp`` wants."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)

    def global_rank(group_rank):
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    received = torch.empty_like(tensor)
    # P2POp accepts torch's own isend/irecv only (not a tracer's wrappers of dist.isend)
    # BEGIN SOLUTION lab8: start_ring_exchange (hint: "the ring exchange" in the notebook)
    operations = [dist.P2POp(distributed_c10d.isend, tensor, global_rank((rank + 1) % cp), group, tag),
                  dist.P2POp(distributed_c10d.irecv, received, global_rank((rank - 1) % cp), group, tag)]
    # END SOLUTION
    return _Transfer(received, dist.batch_isend_irecv(operations))


def backward_step(q: torch.Tensor, kv: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor,
                  out_dot_grad: torch.Tensor, positions: torch.Tensor, cp: int, rank: int,
                  owner: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the ring's backward on rank ``rank``, holding the K/V block ``kv`` (2, batch,
    kv_heads, seq_local, d) of rank ``owner``: (dq, dkv), fp32, dq like q (this rank's queries'
    gradient through that block's keys) and dkv like kv (the block's keys' and values' gradient
    through this rank's queries), zero where nothing is visible. ``lse`` is the forward's final
    log-sum-exp of each query row (over every block), ``out_dot_grad`` the rows'
    :func:`output_dot_grad`, ``positions`` this rank's tokens' global positions. Notebook,
    section 4b, derives it."""
    # BEGIN SOLUTION lab8: backward_step (hint: "one backward step" in the notebook)
    rows, keys, masked = visible_part(cp, rank, owner, q.shape[2])
    grad_q_rows, grad_k, grad_v = block_attention_backward(
        q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], grad_out[:, :, rows], lse[:, :, rows],
        out_dot_grad[:, :, rows], *((positions, positions) if masked else ()))
    grad_q = torch.zeros_like(q, dtype=torch.float32)
    grad_q[:, :, rows] = grad_q_rows
    grad_kv = torch.zeros_like(kv, dtype=torch.float32)
    grad_kv[:, :, :, keys] = torch.stack((grad_k, grad_v))
    # END SOLUTION
    return grad_q, grad_kv


class RingAttention(torch.autograd.Function):
    """Ring attention's forward and backward (see the module's docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, group, clock):
        check_attention_inputs(q, k, v)
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        seq = q.shape[2] * cp
        ctx.group, ctx.seq = group, seq
        with torch.autocast(q.device.type, enabled=False):
            positions = token_positions(seq, cp, rank, q.device)
            kv = torch.stack((k, v))  # one message per step: (2, batch, kv_heads, seq/cp, d)
            for step in range(cp):
                if clock and step < cp - 1:
                    clock.start(q.device)
                # BEGIN SOLUTION lab8: RingAttention.forward (hint: "a forward step" in the notebook)
                transfer = start_ring_exchange(kv, group, KV_TAG) if step < cp - 1 else None
                rows, keys, masked = visible_part(cp, rank, (rank - step) % cp, q.shape[2])
                block_out, block_lse = block_attention(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys],
                                                       *((positions, positions) if masked else ()))
                if step == 0:  # this rank's own block: every row
                    out, lse = block_out, block_lse
                else:
                    out[:, :, rows], lse[:, :, rows] = merge_partials(out[:, :, rows], lse[:, :, rows],
                                                                      block_out, block_lse)
                # END SOLUTION
                if transfer:
                    if clock:
                        clock.computed(q.device)
                    kv = transfer.wait()
                    if clock:
                        clock.waited(q.device)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, seq = ctx.group, ctx.seq
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        with torch.autocast(q.device.type, enabled=False):
            positions = token_positions(seq, cp, rank, q.device)
            out_dot_grad = output_dot_grad(out, grad_out)
            kv = torch.stack((k, v))
            # BEGIN SOLUTION lab8: RingAttention.backward (hint: "the backward ring" in the notebook)
            grad_q = torch.zeros_like(q, dtype=torch.float32)
            arriving = None  # the dK/dV of the block held now, summed by the ranks it visited before
            for step in range(cp):
                kv_transfer = start_ring_exchange(kv, group, KV_TAG) if step < cp - 1 else None
                step_grad_q, grad_kv = backward_step(q, kv, grad_out, lse, out_dot_grad, positions,
                                                     cp, rank, (rank - step) % cp)
                grad_q += step_grad_q
                if step == 0:  # this rank's own block: its share stays home
                    own_grad_kv = grad_kv
                else:
                    if arriving is not None:
                        grad_kv += arriving.wait()
                    arriving = start_ring_exchange(grad_kv, group, GRAD_KV_TAG)
                if kv_transfer:
                    kv = kv_transfer.wait()
            if arriving is not None:  # every other rank's share of this rank's block, home
                own_grad_kv += arriving.wait()
            # END SOLUTION
        return grad_q.to(q.dtype), own_grad_kv[0].to(k.dtype), own_grad_kv[1].to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                   clock: RingClock | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries q (batch, heads, seq/cp, d) over the whole
    sequence, whose keys and values k, v (batch, kv_heads, seq/cp, d) are spread over the
    ``group``'s ranks in the load-balanced layout; returns this rank's output, like q.
    Collective over ``group`` (None: the world), forward and backward. ``clock``: a
    :class:`RingClock` that times each step's compute and transfer wait."""
    return RingAttention.apply(q, k, v, group, clock)
