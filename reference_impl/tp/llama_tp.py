"""Tensor (and sequence) parallelism for the Llama-style parts (``llama_blocks.py``), built from
the single-device modules' weights (shard-from-full) as ``tp_layers`` and ``tp_attention`` do:
SwiGLU's ``gate_up`` column-parallel per block and ``down`` row-parallel (one all-reduce each
way, Shoeybi et al. 2019); grouped-query attention (Ainslie et al. 2023) with the query heads
split over tp and the KV heads split or replicated (``tp_splits.kv_head_layout``, the rule of
Megatron-core and vLLM), replicated KV weights' gradients summed over TP by ``copy_to_tp``;
RMSNorm replicated. Why, and the replicated heads' gradient: docs/library.md, "Beyond the three
dimensions".
"""
from __future__ import annotations

import copy

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.model.llama_blocks import GroupedQueryAttention, SwiGLU
from reference_impl.tp.tp_splits import kv_head_layout
from reference_impl.tp.sequence_parallel import (SequenceParallelColumnLinear,
                                                 SequenceParallelRowLinear, enter_tp_region)
from reference_impl.tp.tp_collectives import copy_to_tp
from reference_impl.tp.tp_layers import ColumnParallelLinear, RowParallelLinear


class SharedInputColumnLinear(ColumnParallelLinear):
    """A column-parallel layer whose input has entered the TP region already (the attention
    enters it once for q, k and v): no ``copy_to_tp`` of its own."""

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class ReplicatedHeads(nn.Module):
    """A k or v projection (``linear``) kept whole on every TP rank, computing the rows of the
    KV heads ``heads`` (a range) only; its input has entered the TP region already. The weight
    goes through ``copy_to_tp``, so its gradient is summed over the TP group (see the module)."""

    def __init__(self, linear: nn.Linear, heads: range, head_dim: int, group=None):
        super().__init__()
        self.group, self.rows = group, slice(heads.start * head_dim, heads.stop * head_dim)
        whole = copy.deepcopy(linear)  # trained on its own, apart from the single-device layer
        self.weight, self.bias = whole.weight, whole.bias

    def forward(self, x):
        weight = copy_to_tp(self.weight, self.group)[self.rows]
        bias = None if self.bias is None else copy_to_tp(self.bias, self.group)[self.rows]
        return F.linear(x, weight, bias)


class ParallelGroupedQueryAttention(GroupedQueryAttention):
    """``GroupedQueryAttention`` with its query heads split over the TP group and its KV heads
    split or replicated (:func:`kv_head_layout`); with ``sequence_parallel`` its input and
    output are this rank's shard of the sequence. The forward is the single-device one."""

    def __init__(self, attention: GroupedQueryAttention, group=None,
                 sequence_parallel: bool = False):
        nn.Module.__init__(self)
        tp = dist.get_world_size(group)
        layout = kv_head_layout(attention.heads, attention.kv_heads, tp)
        self.group, self.sequence_parallel = group, sequence_parallel
        self.rotary, self.attention = attention.rotary, attention.attention
        head_dim = attention.q.out_features // attention.heads
        self.q = SharedInputColumnLinear(attention.q, group)
        self.heads = self.q.weight.shape[0] // head_dim  # the query heads of this rank's shard
        if layout == "split":
            self.kv_heads = attention.kv_heads // tp
            self.k = SharedInputColumnLinear(attention.k, group)
            self.v = SharedInputColumnLinear(attention.v, group)
        else:
            sharing = tp // attention.kv_heads  # ranks per KV head
            first = dist.get_rank(group) // sharing
            self.kv_heads, mine = 1, range(first, first + 1)
            self.k = ReplicatedHeads(attention.k, mine, head_dim, group)
            self.v = ReplicatedHeads(attention.v, mine, head_dim, group)
        self.proj = (SequenceParallelRowLinear(attention.proj, group) if sequence_parallel
                     else RowParallelLinear(attention.proj, group, input_is_parallel=True))

    def project(self, x, positions=None):
        return super().project(enter_tp_region(x, self.group, self.sequence_parallel), positions)


class ParallelSwiGLU(SwiGLU):
    """``SwiGLU``'s forward with ``gate_up`` column-parallel per block (this rank's gate and up
    slices) and ``down`` row-parallel; the SP layers with ``sequence_parallel``."""

    def __init__(self, mlp: SwiGLU, group=None, sequence_parallel: bool = False):
        nn.Module.__init__(self)
        if sequence_parallel:
            self.gate_up = SequenceParallelColumnLinear(mlp.gate_up, group, blocks=2)
            self.down = SequenceParallelRowLinear(mlp.down, group)
        else:
            self.gate_up = ColumnParallelLinear(mlp.gate_up, group, blocks=2)
            self.down = RowParallelLinear(mlp.down, group, input_is_parallel=True)
