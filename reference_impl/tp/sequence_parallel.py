"""Sequence parallelism for the transformer block (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.2.2 and its Figure 5).

Outside the attention and the MLP, TP rank r holds only its 1/tp of the sequence: the
column-parallel layer's ``copy_to_tp`` becomes ``gather_from_sp`` and the row-parallel layer's
all-reduce ``reduce_scatter_to_sp``, the same traffic, with the layernorms' and residuals'
activations at 1/tp. The replicated parameters used on the shard are marked
``sequence_parallel = True`` and :func:`sync_sequence_parallel_grads` sums their gradients over
the TP group. The data flow: docs/library.md, 'Sequence parallelism'.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.model import Block
from reference_impl.tp.tp_attention import ParallelBlock
from reference_impl.tp.tp_collectives import copy_to_tp, gather_from_sp, reduce_scatter_to_sp
from reference_impl.tp.tp_layers import ColumnParallelLinear, RowParallelLinear

SEQ_DIM = 1  # of (batch, seq, hidden)


def _mark_sequence_parallel(*parameters) -> None:
    for parameter in parameters:
        if parameter is not None:
            parameter.sequence_parallel = True


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """Column-parallel, its input the sequence shard: all-gathered along seq (g), not copied."""

    def forward(self, x):
        return F.linear(gather_from_sp(x, SEQ_DIM, self.group), self.weight, self.bias)


class SequenceParallelRowLinear(RowParallelLinear):
    """Row-parallel (input already split), its output reduce-scattered along seq (g-bar), not
    all-reduced; the bias is then added on the sequence shard, so it is sequence-parallel."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__(linear, group, input_is_parallel=True)
        _mark_sequence_parallel(self.bias)

    def forward(self, x):
        y = reduce_scatter_to_sp(F.linear(x, self.weight), SEQ_DIM, self.group)
        return y if self.bias is None else y + self.bias


class SequenceParallelBlock(ParallelBlock):
    """``model.Block`` (its forward as it is) with TP attention and MLP whose linear layers
    communicate the SP way; input and output are this rank's shard along the sequence (dim 1).
    After the backward, call :func:`sync_sequence_parallel_grads`."""

    def __init__(self, block: Block, group=None):
        super().__init__(block, group)  # the TP block: checks, layernorms, attention, MLP
        # The same shards as the TP block's linear layers, with the SP collectives.
        self.attn.qkv = SequenceParallelColumnLinear(block.attn.qkv, group, blocks=3)
        self.attn.proj = SequenceParallelRowLinear(block.attn.proj, group)
        self.mlp.fc1 = SequenceParallelColumnLinear(block.mlp.fc1, group)
        self.mlp.fc2 = SequenceParallelRowLinear(block.mlp.fc2, group)
        _mark_sequence_parallel(*self.ln1.parameters(), *self.ln2.parameters())


def sync_sequence_parallel_grads(module: nn.Module, group=None) -> None:
    """Sum over the TP group the gradients of ``module``'s parameters marked sequence_parallel,
    in one all-reduce (they are small: latency, not bandwidth, is the cost). Call after the
    backward, before the optimizer step; collective over the group."""
    grads = [parameter.grad for parameter in module.parameters()
             if getattr(parameter, "sequence_parallel", False) and parameter.grad is not None]
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([grad.flatten() for grad in grads])
    dist.all_reduce(flat, group=group)
    for grad, summed in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(summed.view_as(grad))


def enter_tp_region(x, group=None, sequence_parallel: bool = False):
    """The attention's input, entering the TP region once for q, k and v: with
    ``sequence_parallel`` all-gathered along the sequence (every head needs every token), else
    ``copy_to_tp`` (one all-reduce of its gradient)."""
    return gather_from_sp(x, SEQ_DIM, group) if sequence_parallel else copy_to_tp(x, group)
