"""The tensor-parallel (with sequence parallelism: SP) version of any ``model.Block``: the GPT's
own ``ParallelBlock``/``SequenceParallelBlock`` for a block of GPT attention and GeLU MLP, else
a block whose every part (layernorm or RMSNorm, GPT or grouped-query attention, GeLU or
SwiGLU MLP) is replaced by its TP version (``tp_attention``, ``tp_layers``, ``llama_tp``).
"""
from __future__ import annotations

import copy

from torch import nn

from reference_impl.model.llama_blocks import GroupedQueryAttention, SwiGLU
from reference_impl.model import MLP, Block, CausalSelfAttention
from reference_impl.tp.llama_tp import ParallelGroupedQueryAttention, ParallelSwiGLU
from reference_impl.tp.sequence_parallel import (SequenceParallelBlock,
                                                 SequenceParallelColumnLinear,
                                                 SequenceParallelRowLinear,
                                                 _mark_sequence_parallel)
from reference_impl.tp.tp_attention import ParallelBlock, ParallelSelfAttention
from reference_impl.tp.tp_layers import ParallelMLP


def parallel_attention(attention: nn.Module, group=None, sequence_parallel: bool = False):
    """The TP (or SP) version of a block's attention, grouped-query or the GPT's."""
    if isinstance(attention, GroupedQueryAttention):
        return ParallelGroupedQueryAttention(attention, group, sequence_parallel)
    parallel = ParallelSelfAttention(attention, group)
    if sequence_parallel:  # the SP collectives around the same shards, as SequenceParallelBlock
        parallel.qkv = SequenceParallelColumnLinear(attention.qkv, group, blocks=3)
        parallel.proj = SequenceParallelRowLinear(attention.proj, group)
    return parallel


def parallel_mlp(mlp: nn.Module, group=None, sequence_parallel: bool = False):
    """The TP (or SP) version of a block's MLP, SwiGLU or the GPT's."""
    if isinstance(mlp, SwiGLU):
        return ParallelSwiGLU(mlp, group, sequence_parallel)
    parallel = ParallelMLP(mlp, group)
    if sequence_parallel:
        parallel.fc1 = SequenceParallelColumnLinear(mlp.fc1, group)
        parallel.fc2 = SequenceParallelRowLinear(mlp.fc2, group)
    return parallel


class ParallelPartsBlock(Block):
    """``model.Block``'s forward with any of its parts (RMSNorm or layernorm, grouped-query or
    GPT attention, SwiGLU or GeLU MLP) tensor-parallel; the norms are copies, whole on every
    rank. With ``sequence_parallel`` the SP block: input and output this rank's shard of the
    sequence (dim 1); after the backward, call ``sync_sequence_parallel_grads``."""

    def __init__(self, block: Block, group=None, sequence_parallel: bool = False):
        nn.Module.__init__(self)
        self.ln1, self.ln2 = copy.deepcopy((block.ln1, block.ln2))  # whole, trained apart
        self.attn = parallel_attention(block.attn, group, sequence_parallel)
        self.mlp = parallel_mlp(block.mlp, group, sequence_parallel)
        if sequence_parallel:
            _mark_sequence_parallel(*self.ln1.parameters(), *self.ln2.parameters())


def parallel_block(block: Block, group=None, sequence_parallel: bool = False) -> Block:
    """The TP (with ``sequence_parallel``: SP) version of a block: the GPT's own classes for a
    block of GPT attention and GeLU MLP, else :class:`ParallelPartsBlock`."""
    if isinstance(block.attn, CausalSelfAttention) and isinstance(block.mlp, MLP):
        return SequenceParallelBlock(block, group) if sequence_parallel else ParallelBlock(block, group)
    return ParallelPartsBlock(block, group, sequence_parallel)
