# Student file for the labs, generated from reference_impl/tp/tp_collectives.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Autograd-aware collectives for tensor parallelism: Megatron-LM's conjugate pairs.

The gradient of a "copy to every rank" is a "sum over every rank", and the reverse (Shoeybi et
al. 2019, the f and g operators of Figure 3; Korthikanti et al. 2022 for the sequence-parallel
pair; lab 2's notebook, "2. Two collectives and their gradients"; ``docs/library.md``, "Sequence
parallelism"). On a group of one rank every function is the identity.

    function                    forward         backward        used at
    copy_to_tp                  identity        all-reduce      input of a column-parallel layer (f)
    reduce_from_tp              all-reduce      identity        output of a row-parallel layer (g)
    scatter_to_tp(x, dim)       keep my slice   all-gather      input of a row-parallel layer, not split yet
    gather_from_tp(x, dim)      all-gather      keep my slice   output of a column-parallel layer, gathered
    reduce_scatter_to_sp(x,dim) reduce-scatter  all-gather      output of a row-parallel layer, SP (g-bar)
    gather_from_sp(x, dim)      all-gather      reduce-scatter  input of a column-parallel layer, SP (f-bar)
"""
from __future__ import annotations

import torch
import torch.distributed as dist


# --------------------------------------------------------- plain (non-autograd) primitives

def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    x = x.clone(memory_format=torch.contiguous_format)  # never modify a tensor autograd saved
    dist.all_reduce(x, group=group)
    return x


def all_gather_along(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate every rank's x along dim (no autograd)."""
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format)
             for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    if x.shape[dim] % n:
        raise ValueError(f"cannot split dimension {dim} of size {x.shape[dim]} evenly over "
                         f"{n} ranks")
    return x.chunk(n, dim=dim)[dist.get_rank(group)].contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    if x.shape[dim] % n:
        raise ValueError(f"cannot reduce-scatter dimension {dim} of size {x.shape[dim]} "
                         f"evenly over {n} ranks")
    inputs = [part.contiguous() for part in x.chunk(n, dim=dim)]
    output = torch.empty_like(inputs[0])
    dist.reduce_scatter(output, inputs, group=group)
    return output


def _single(group) -> bool:
    return dist.get_world_size(group) == 1


# ------------------------------------------------------------------- autograd functions

class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        raise NotImplementedError('lab2: _CopyToTP.forward (hint: "the operators f and g" in the notebook)')

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError('lab2: _CopyToTP.backward (hint: "the operators f and g" in the notebook)')


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        raise NotImplementedError('lab2: _ReduceFromTP.forward (hint: "the operators f and g" in the notebook)')

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError('lab2: _ReduceFromTP.backward (hint: "the operators f and g" in the notebook)')


def _dim_pair(name: str, forward_op, backward_op):
    """An autograd function applying ``forward_op(x, dim, group)`` forward and
    ``backward_op(grad, dim, group)`` backward."""

    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return forward_op(x, dim, group)

    def backward(ctx, grad):
        return backward_op(grad, ctx.dim, ctx.group), None, None

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


_ScatterToTP = _dim_pair("_ScatterToTP", _split, all_gather_along)
_GatherFromTP = _dim_pair("_GatherFromTP", all_gather_along, _split)
_ReduceScatterToSP = _dim_pair("_ReduceScatterToSP", _reduce_scatter, all_gather_along)
_GatherFromSP = _dim_pair("_GatherFromSP", all_gather_along, _reduce_scatter)


# ---------------------------------------------------------------------- the public API

def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    return x if _single(group) else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    return x if _single(group) else _ReduceFromTP.apply(x, group)


def scatter_to_tp(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    return x if _single(group) else _ScatterToTP.apply(x, dim, group)


def gather_from_tp(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    return x if _single(group) else _GatherFromTP.apply(x, dim, group)


def reduce_scatter_to_sp(x: torch.Tensor, dim: int = 1, group=None) -> torch.Tensor:
    return x if _single(group) else _ReduceScatterToSP.apply(x, dim, group)


def gather_from_sp(x: torch.Tensor, dim: int = 1, group=None) -> torch.Tensor:
    return x if _single(group) else _GatherFromSP.apply(x, dim, group)
