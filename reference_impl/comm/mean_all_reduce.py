"""A mean of gradients over a group: the tensors summed by one all-reduce of a flat copy, then
divided. ``moe.expert_parallel`` averages its dense and expert gradients with it (lab 9);
``hybrid.data_parallel`` has the bucketed form DDP uses.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def all_reduce_mean(tensors: Sequence[torch.Tensor], group, divisor: int) -> int:
    """Sum ``tensors`` in place over ``group`` and divide by ``divisor``, in one all-reduce.
    Every rank of the group must pass tensors of the same shapes in the same order. Returns
    the number of all-reduces run: 1, or 0 with no tensors or for a group of one rank."""
    if not tensors:
        return 0
    flat = torch.cat([tensor.reshape(-1) for tensor in tensors])
    reduced = dist.get_world_size(group) > 1
    if reduced:
        dist.all_reduce(flat, group=group)
    flat /= divisor
    for tensor, part in zip(tensors, flat.split([tensor.numel() for tensor in tensors])):
        tensor.copy_(part.view_as(tensor))
    return int(reduced)
