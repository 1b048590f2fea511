"""The same tensor parallelism with PyTorch's own DTensor, for cross-checks and benchmarks.

PyTorch parallelizes a stock module with ``parallelize_module`` and a layer plan on a
``DeviceMesh``: ``ColwiseParallel`` for a layer split by output rows, ``RowwiseParallel`` for
one split by input columns, the same split as the reference's column- and row-parallel layers.
The one difference is the fused [q; k; v] projection: a plain contiguous split of its rows
would give rank 0 (part of) the q rows only, while Megatron's split gives each rank the q, k
and v of its own heads (``ColumnParallelLinear(blocks=3)``). Permuting the rows first makes the
stock split the Megatron one (:func:`qkv_rows_by_rank`).
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from reference_impl.model import MLP, Block, CausalSelfAttention
from reference_impl.tp.tp_splits import check_head_split


def dtensor_mlp(mlp: MLP, mesh) -> nn.Module:
    """A deep copy of ``mlp``: fc1 ``ColwiseParallel``, fc2 ``RowwiseParallel``."""
    return parallelize_module(copy.deepcopy(mlp), mesh,
                              {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def qkv_rows_by_rank(hidden: int, tp: int) -> torch.Tensor:
    """The permutation of the fused qkv rows that DTensor's contiguous split needs.

    The fused weight's rows are [q; k; v], each block the heads in order: row index
    (block, rank, row within the rank's heads), shape (3, tp, hidden/tp). ``ColwiseParallel``
    gives rank r the r-th contiguous tp-th of the rows, which, taken as is, would be (part of)
    the q rows only. Reordered as (rank, block, row), rank r's contiguous slice is exactly
    [q_r; k_r; v_r]: its own heads' q, k and v, in the order ``split_heads`` expects with
    ``heads = heads / tp`` (the shard Megatron's blocks=3 split gives the reference).
    """
    return torch.arange(3 * hidden).view(3, tp, hidden // tp).transpose(0, 1).reshape(-1)


def dtensor_attention(attention: CausalSelfAttention, mesh) -> nn.Module:
    """A deep copy of ``attention`` parallelized by DTensor, with Megatron's head split.

    Permuting qkv's output rows (``qkv_rows_by_rank``), and nothing else, lets PyTorch's stock
    ``ColwiseParallel`` give each rank its heads' q, k and v: the module stays a stock module
    under a stock layer plan, and computes the same function as ``attention`` (a gathered
    qkv gradient is in the permuted order). ``heads`` becomes the local heads, as in
    ``ParallelSelfAttention``.
    """
    tp = mesh.size()
    check_head_split(attention.heads, tp)
    local = copy.deepcopy(attention)
    rows = qkv_rows_by_rank(attention.proj.in_features, tp).to(attention.qkv.weight.device)
    with torch.no_grad():
        local.qkv.weight.copy_(attention.qkv.weight[rows])
        local.qkv.bias.copy_(attention.qkv.bias[rows])
    local.heads = attention.heads // tp
    return parallelize_module(local, mesh, {"qkv": ColwiseParallel(), "proj": RowwiseParallel()})


def dtensor_block(block: Block, mesh) -> nn.Module:
    """A deep copy of ``block`` with DTensor TP attention and MLP; layernorms replicated."""
    parallel = copy.deepcopy(block)
    parallel.attn = dtensor_attention(block.attn, mesh)
    parallel.mlp = dtensor_mlp(block.mlp, mesh)
    return parallel
