"""Tensor (and sequence) parallelism for the Llama-style parts (``llama_blocks.py``), built from
the single-device modules' weights (shard-from-full) as ``tp_layers`` and ``tp_attention`` do,
with their layers, their ``shard`` marks (``tp_dim``, ``tp_blocks``: ``full_state`` gathers
every parameter back to its single-device name) and the conjugate collectives.

* **SwiGLU**: ``gate_up`` column-parallel with ``blocks=2``, so that rank r holds its slice of
  the gate *and* its slice of up (silu(gate) * up is then local), ``down`` row-parallel: one
  all-reduce forward and one backward, as the GeLU MLP (Shoeybi et al. 2019).
* **Grouped-query attention** (Ainslie et al. 2023): the query heads are split over the tp
  ranks (heads % tp == 0), q column-parallel and ``proj`` row-parallel as in the GPT. Rank r's
  query heads [r h/tp, (r+1) h/tp) use the KV heads [r h/tp / g, ...) with g = heads / kv_heads,
  and the KV heads are

      split        kv_heads % tp == 0   k and v column-parallel: rank r holds kv_heads / tp heads
      replicated   tp % kv_heads == 0   rank r uses one KV head, r // (tp / kv_heads), shared
                                        with the tp / kv_heads ranks of its group of query heads

  (the rule of Megatron-core's grouped-query attention and of vLLM's QKVParallelLinear, which
  replicate a KV head over the ranks that need it); any other (kv_heads, tp) is refused, with
  the rule and the numbers (``head_split.kv_head_layout``).
* **Replicated KV weights** (:class:`ReplicatedHeads`): k and v stay whole on every rank, so
  ``full_state`` returns them as they are (a replicated parameter has no ``tp_dim``), and each
  rank computes only the rows of the KV head it uses. Each rank's gradient of the weight is then
  its own query heads' part, on its KV head's rows only; the single-device gradient is the sum
  of those parts over the ranks. The weight enters the forward through ``copy_to_tp``
  (identity forward, all-reduce backward), so autograd itself sums the parts over the TP group:
  every rank ends the backward with the whole gradient, the same on every rank, before any
  data-parallel reduction or optimizer step sees it (no extra sync to forget, unlike the
  sequence-parallel parameters). ``tests/library/llama`` checks the gradient, and that one
  rank's part alone is not it.
* **RMSNorm** is replicated (with sequence parallelism, marked ``sequence_parallel`` and summed
  by ``sync_sequence_parallel_grads``, as the GPT's layernorms).

The attention's input enters the TP region once for q, k and v: ``copy_to_tp`` (one
all-reduce of its gradient), or with sequence parallelism ``gather_from_sp`` (all-gather
along the sequence; Korthikanti et al. 2022). The rotary positions are then the whole
sequence's 0..s-1 on every rank.
"""
from __future__ import annotations

import copy

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.llama_blocks import GroupedQueryAttention, SwiGLU
from reference_impl.tp.head_split import kv_head_layout
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
