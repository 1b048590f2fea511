"""Context parallelism as a step of ``parallelize.py``: the GPT's sequence split over a CP group.

With ``cp`` > 1 every rank of a CP group holds the same weights and the same samples, and a
share of every sample's tokens: the load-balanced layout of ``cp/load_balance.py`` (two chunks
of 2cp each). What changes, as in Megatron-core's context parallelism:

* **Data.** :func:`context_shard` cuts the replica's tokens and targets along the sequence; the
  embedding, the norms, the MLPs, the head and the loss are per token and run on the shard as
  they would on the whole sequence (so do the pipeline's boundaries: micro_batch x seq/cp).
* **Attention** (:func:`context_parallel_attention`, ``parallelize.apply_cp``). Each block's
  attention becomes a ``cp_attention.ContextParallelAttention`` over the CP group: rotary
  positions from the tokens' global places, ring attention over the whole sequence. The model's
  attention is already the TP one (this rank's heads; a TP group of one without tp), so it is
  :class:`TensorParallelContextAttention`: the same shards, no copy, its input entering the TP
  region (``sequence_parallel.enter_tp_region``: with sequence parallelism the all-gather of the CP
  shard's tokens) before the ring.
* **Loss and gradients.** A rank's loss is the mean over its tokens, and every rank holds the
  same number (seq/cp per sample), so the global batch's mean loss is the mean over the dp x cp
  ranks of RDP_CP_GROUP, and its gradient the mean of theirs: the data-parallel reduction runs
  over RDP_CP (``ParallelGroups.rdp_cp_or_rdp``) instead of RDP, divided by dp x cp, with
  every ``dp_kind`` (ZeRO shards over dp x cp ranks, as Megatron-core's distributed optimizer).
  Each CP rank is one more data shard; no separate CP sync is needed.

What does not compose is refused (``training_plan.check_context_parallel``): the GPT's learned position
embedding (it would number each rank's tokens 0..seq/cp-1; the rotary attention is given their
global places), a sequence not divisible into 2cp chunks, or whose CP shard ``tp`` does not
divide under sequence parallelism.
"""
from __future__ import annotations

import torch
from torch import nn

from reference_impl.cp.cp_attention import ContextParallelAttention
from reference_impl.cp.load_balance import shard_sequence
from reference_impl.model import Block
from reference_impl.tp.llama_tp import ParallelGroupedQueryAttention
from reference_impl.tp.sequence_parallel import enter_tp_region


class TensorParallelContextAttention(ContextParallelAttention):
    """A block's tensor-parallel grouped-query attention (``llama_tp``, this rank's heads and
    shards, taken as they are) on the CP ``group``: its input enters the TP region, then the
    CP layer's projections, rotary positions and ring; ``proj`` is the TP layer's row-parallel
    one (all-reduce, or reduce-scatter under sequence parallelism)."""

    def __init__(self, attention: ParallelGroupedQueryAttention, group=None, variant: str = "ring"):
        super().__init__(attention, group, variant, copy_weights=False)
        self.tp_group, self.sequence_parallel = attention.group, attention.sequence_parallel

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return enter_tp_region(x, self.tp_group, self.sequence_parallel)


def context_parallel_attention(stages: nn.ModuleDict, group, variant: str = "ring") -> int:
    """Every block's attention in ``stages`` to its context-parallel version over ``group``,
    sharing its parameters (so the model's names of them stay); returns how many."""
    count = 0
    for stage in stages.values():
        for module in stage.modules():
            if isinstance(module, Block):
                if not isinstance(module.attn, ParallelGroupedQueryAttention):
                    raise TypeError(f"context parallelism runs the grouped-query attention of "
                                    f"llama_tp; this block's is {type(module.attn).__name__}")
                module.attn = TensorParallelContextAttention(module.attn, group, variant)
                count += 1
    return count


def context_shard(batch: torch.Tensor, cp: int, cp_rank: int) -> torch.Tensor:
    """This CP rank's tokens of ``batch`` (samples, seq): its two chunks of every sample, the
    load-balanced layout's (the whole batch when cp = 1)."""
    return batch if cp == 1 else shard_sequence(batch, cp, cp_rank, dim=1)
