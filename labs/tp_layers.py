# Student file for the labs, generated from reference_impl/tp/tp_layers.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
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
from tp_collectives import (all_gather_along, copy_to_tp, gather_from_tp,
                                           reduce_from_tp, scatter_to_tp)
from reference_impl.tp.tp_splits import check_divisible


def shard(full: torch.Tensor, dim: int, rank: int, tp: int, blocks: int = 1) -> torch.Tensor:
    """Rank ``rank``'s shard of ``full``: along ``dim``, ``full`` is ``blocks`` equal blocks (a
    fused [q; k; v] weight is 3), each split in tp equal pieces on its own; rank r keeps piece r
    of every block, in block order. A new tensor, not a view of ``full``."""
    raise NotImplementedError('lab2: shard (hint: "shards of a fused weight" in the notebook)')


def unshard(local: torch.Tensor, parameter: nn.Parameter, group=None) -> torch.Tensor:
    """The full tensor (a parameter's value or gradient) from every rank's shard; a replicated
    parameter's tensor is returned as it is. Collective over the TP group."""
    raise NotImplementedError('lab2: unshard (hint: "shards of a fused weight" in the notebook)')


def sharded_parameter(full: torch.Tensor, dim: int, group, blocks: int = 1) -> nn.Parameter:
    """This rank's shard of ``full`` as a parameter of its own, marked ``tp_dim`` and
    ``tp_blocks`` for :func:`unshard`."""
    raise NotImplementedError('lab2: sharded_parameter (hint: "shards of a fused weight" in the notebook)')


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
        raise NotImplementedError('lab2: ColumnParallelLinear.__init__ (hint: "shards of both layers" in the notebook)')

    def forward(self, x):
        raise NotImplementedError('lab2: ColumnParallelLinear.forward (hint: "the two forward passes" in the notebook)')


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W split by input columns over the TP group; b whole on every rank."""

    def __init__(self, linear: nn.Linear, group=None, input_is_parallel: bool = True):
        super().__init__()
        check_divisible(linear.in_features, dist.get_world_size(group), "input features")
        self.group, self.input_is_parallel = group, input_is_parallel
        raise NotImplementedError('lab2: RowParallelLinear.__init__ (hint: "shards of both layers" in the notebook)')

    def forward(self, x):
        raise NotImplementedError('lab2: RowParallelLinear.forward (hint: "the two forward passes" in the notebook)')


class ParallelMLP(MLP):
    """The TP MLP: ``model.MLP``'s forward, fc1 column-parallel and fc2 row-parallel, so the
    GeLU runs on each rank's slice and only fc2's output is all-reduced."""

    def __init__(self, mlp: MLP, group=None):
        nn.Module.__init__(self)
        raise NotImplementedError('lab2: ParallelMLP.__init__ (hint: "the TP MLP" in the notebook)')


def full_state(module: nn.Module, group=None, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (or its gradient) of a TP module, gathered to its single-device shape,
    by name. Collective over the TP group."""
    state = {}
    for name, parameter in module.named_parameters():
        local = parameter.grad if grads else parameter.detach()
        state[name] = None if local is None else unshard(local, parameter, group)
    return state
