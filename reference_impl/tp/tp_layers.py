"""Megatron-style tensor-parallel linear layers and MLP, built from single-device modules.

A linear layer y = x W^T + b splits two ways (Shoeybi et al. 2019, "Megatron-LM"; the course
notes "Week 15 - Tensor Parallelism and Pipeline Parallelism"): :class:`ColumnParallelLinear`
by output rows (rank r computes its slice of the output from the whole input, ``copy_to_tp``),
:class:`RowParallelLinear` by input columns (partial outputs from its slice of the input,
summed by ``reduce_from_tp``, the whole bias added once). Column then row needs nothing in
between: the TP MLP (column fc1 -> GeLU -> row fc2) does one all-reduce forward and one
backward. A sharded parameter carries ``tp_dim`` (the dimension split) and ``tp_blocks`` (equal
blocks split one by one, 3 for a fused [q; k; v]); one without ``tp_dim`` is replicated.
:func:`shard` and :func:`unshard` convert between the two.

Lab 2's notebook, "1. Splitting a linear layer" to "4. The tensor-parallel MLP".
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.model import MLP
from reference_impl.tp.tp_collectives import (all_gather_along, copy_to_tp, gather_from_tp,
                                           reduce_from_tp, scatter_to_tp)
from reference_impl.tp.tp_splits import check_divisible


def shard(full: torch.Tensor, dim: int, rank: int, tp: int, blocks: int = 1) -> torch.Tensor:
    """Rank ``rank``'s shard of ``full``: along ``dim``, ``full`` is ``blocks`` equal blocks (a
    fused [q; k; v] weight is 3), each split in tp equal pieces on its own; rank r keeps piece r
    of every block, in block order. A new tensor, not a view of ``full``."""
    # BEGIN SOLUTION lab2: shard (hint: "shards of a fused weight" in the notebook)
    pieces = [block.chunk(tp, dim=dim)[rank] for block in full.chunk(blocks, dim=dim)]
    return torch.cat(pieces, dim=dim).clone()
    # END SOLUTION


def unshard(local: torch.Tensor, parameter: nn.Parameter, group=None) -> torch.Tensor:
    """The full tensor (a parameter's value or gradient) from every rank's shard; a replicated
    parameter's tensor is returned as it is. Collective over the TP group."""
    # BEGIN SOLUTION lab2: unshard (hint: "shards of a fused weight" in the notebook)
    dim = getattr(parameter, "tp_dim", None)
    if dim is None:
        return local
    tp, blocks = dist.get_world_size(group), parameter.tp_blocks
    pieces = all_gather_along(local, dim, group).chunk(tp * blocks, dim=dim)  # rank-major
    return torch.cat([pieces[r * blocks + b] for b in range(blocks) for r in range(tp)], dim=dim)
    # END SOLUTION


def sharded_parameter(full: torch.Tensor, dim: int, group, blocks: int = 1) -> nn.Parameter:
    """This rank's shard of ``full`` as a parameter of its own, marked ``tp_dim`` and
    ``tp_blocks`` for :func:`unshard`."""
    # BEGIN SOLUTION lab2: sharded_parameter (hint: "shards of a fused weight" in the notebook)
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    parameter = nn.Parameter(shard(full.detach(), dim, rank, tp, blocks))
    parameter.tp_dim, parameter.tp_blocks = dim, blocks
    return parameter
    # END SOLUTION


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W split by output rows over the TP group."""

    def __init__(self, linear: nn.Linear, group=None, gather_output: bool = False,
                 blocks: int = 1):
        super().__init__()
        tp = dist.get_world_size(group)
        if linear.out_features % blocks:
            raise ValueError(f"output features {linear.out_features} are not made of {blocks} "
                             f"equal blocks: {linear.out_features} is not divisible by {blocks}")
        check_divisible(linear.out_features // blocks, tp,
                         "output features" + (f" per block ({blocks} blocks)" if blocks > 1 else ""))
        self.group, self.gather_output = group, gather_output
        # BEGIN SOLUTION lab2: ColumnParallelLinear.__init__ (hint: "shards of both layers" in the notebook)
        self.weight = sharded_parameter(linear.weight, 0, group, blocks)
        self.bias = (sharded_parameter(linear.bias, 0, group, blocks)
                     if linear.bias is not None else None)
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION lab2: ColumnParallelLinear.forward (hint: "the two forward passes" in the notebook)
        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        return gather_from_tp(y, -1, self.group) if self.gather_output else y
        # END SOLUTION


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns over the TP group; b whole on every rank."""

    def __init__(self, linear: nn.Linear, group=None, input_is_parallel: bool = True):
        super().__init__()
        check_divisible(linear.in_features, dist.get_world_size(group), "input features")
        self.group, self.input_is_parallel = group, input_is_parallel
        # BEGIN SOLUTION lab2: RowParallelLinear.__init__ (hint: "shards of both layers" in the notebook)
        self.weight = sharded_parameter(linear.weight, 1, group)
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION lab2: RowParallelLinear.forward (hint: "the two forward passes" in the notebook)
        if not self.input_is_parallel:
            x = scatter_to_tp(x, -1, self.group)
        y = reduce_from_tp(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y
        # END SOLUTION


class ParallelMLP(MLP):
    """The TP MLP: ``model.MLP``'s forward, fc1 column-parallel and fc2 row-parallel, so the
    GeLU runs on each rank's slice and only fc2's output is all-reduced."""

    def __init__(self, mlp: MLP, group=None):
        nn.Module.__init__(self)
        # BEGIN SOLUTION lab2: ParallelMLP.__init__ (hint: "the TP MLP" in the notebook)
        self.fc1 = ColumnParallelLinear(mlp.fc1, group)
        self.fc2 = RowParallelLinear(mlp.fc2, group, input_is_parallel=True)
        # END SOLUTION


def full_state(module: nn.Module, group=None, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (or its gradient) of a TP module, gathered to its single-device shape,
    by name. Collective over the TP group."""
    state = {}
    for name, parameter in module.named_parameters():
        local = parameter.grad if grads else parameter.detach()
        state[name] = None if local is None else unshard(local, parameter, group)
    return state
