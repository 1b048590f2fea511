# Student file for the labs, generated from reference_impl/comm/collectives.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Ring all-reduce, built by hand from point-to-point sends and receives.

The n ranks of a group form a ring; each sends to its right neighbour and receives from its
left. The tensor is cut into n chunks, and the all-reduce runs in two phases of n-1 steps:

1. reduce-scatter: at step s, rank r sends chunk (r - s) mod n and adds the chunk it receives
   into chunk (r - s - 1) mod n. After n-1 steps rank r holds the full sum of chunk (r + 1) mod n.
2. all-gather: at step s, rank r sends chunk (r + 1 - s) mod n (one that is complete) and
   overwrites chunk (r - s) mod n with the one it receives. After n-1 steps every rank has
   every complete chunk.

Each rank sends 2(n-1) chunks of S/n bytes: 2(n-1)/n * S in all, nearly independent of n. That
is why the ring is bandwidth-optimal, and where the alpha-beta cost 2(n-1)*alpha +
2(n-1)/n * S/B of ``alpha_beta.py`` comes from.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def ring_chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n views into ``flat``, as equal as possible (the first ones one element longer)."""
    return list(torch.tensor_split(flat, n))


def _exchange(send: torch.Tensor, receive: torch.Tensor, group) -> None:
    """Send ``send`` to the right neighbour while receiving ``receive`` from the left one."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    right = dist.get_global_rank(group, (rank + 1) % n) if group else (rank + 1) % n
    left = dist.get_global_rank(group, (rank - 1) % n) if group else (rank - 1) % n
    outgoing = dist.isend(send.contiguous(), right, group=group)
    dist.recv(receive, left, group=group)
    outgoing.wait()


def ring_reduce_scatter(chunks: list[torch.Tensor], group=None) -> None:
    """Phase 1, in place: afterwards chunk (rank + 1) mod n holds the sum over all ranks."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    raise NotImplementedError('lab0: the n-1 reduce-scatter steps: at each step every rank passes one chunk to its right neighbour (_exchange) and adds the chunk arriving from its left into its own copy of that chunk; choose the chunks so that each step passes on the chunk that has just grown, and after n-1 steps chunk (rank + 1) mod n holds the sum over all n ranks')


def ring_all_gather(chunks: list[torch.Tensor], group=None) -> None:
    """Phase 2, in place: starting with chunk (rank + 1) mod n complete, make every chunk complete."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    raise NotImplementedError('lab0: the n-1 all-gather steps: each rank starts with one complete chunk, (rank + 1) mod n; at each step it passes on the complete chunk it got most recently and stores the one arriving from its left in place, so that after n-1 steps every chunk is complete on every rank')


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over the group, in place, with the two ring phases; returns it."""
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1)
    chunks = ring_chunks(flat, dist.get_world_size(group))
    ring_reduce_scatter(chunks, group)
    ring_all_gather(chunks, group)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor
