# Student file for the labs, generated from reference_impl/tp/tp_attention.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Megatron tensor-parallel attention and transformer block: the lab "Implement Tensor-Parallel
Attention" of the course notes "Week 15 - Tensor Parallelism and Pipeline Parallelism".

Attention heads are independent, so each of the tp ranks computes heads/tp of them with no
communication between two linear layers split the Megatron way (Shoeybi et al. 2019): the fused
QKV projection column-parallel with ``blocks=3`` (rank r gets the q, k and v rows of its heads),
causal attention on the local heads (``model.CausalSelfAttention``'s forward, with either
kernel, ``"explicit"`` or ``"sdpa"``), and the output projection row-parallel, one all-reduce
summing the partial outputs. A TP block puts attention and the TP MLP between replicated
layernorms: 2 all-reduces forward and 2 backward (the input gradients of QKV and of fc1).

Lab 3's notebook, "1. Attention, head by head" to "4. Communication per block".
"""
from __future__ import annotations

import copy

import torch.distributed as dist
from torch import nn

from reference_impl.model import Block, CausalSelfAttention, attention_core, merge_heads, split_heads
from reference_impl.tp.tp_splits import check_divisible, check_head_split
from reference_impl.tp.tp_layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear


class ParallelSelfAttention(CausalSelfAttention):
    """``CausalSelfAttention`` with its heads split over the TP group."""

    # The forward is CausalSelfAttention's steps on this rank's heads, so selective
    # recomputation (memory/recompute.py), which re-implements those steps, may stand in for it.
    forward_is_causal_self_attention = True

    def __init__(self, attention: CausalSelfAttention, group=None):
        nn.Module.__init__(self)
        tp = dist.get_world_size(group)
        check_head_split(attention.heads, tp)
        self.attention = attention.attention  # the same kernel ("explicit" or "sdpa")
        raise NotImplementedError('lab3: ParallelSelfAttention.__init__ (hint: "the heads of a rank" in the notebook)')

    def forward(self, x):
        raise NotImplementedError('lab3: ParallelSelfAttention.forward (hint: "forward on its heads" in the notebook)')


class ParallelBlock(Block):
    """``model.Block`` with TP attention and a TP MLP; the layernorms stay whole on every rank."""

    def __init__(self, block: Block, group=None):
        nn.Module.__init__(self)
        tp, hidden = dist.get_world_size(group), block.ln1.normalized_shape[0]
        check_divisible(hidden, tp, "hidden size")
        raise NotImplementedError('lab3: ParallelBlock.__init__ (hint: "the TP block" in the notebook)')
