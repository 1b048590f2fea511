# Student file for the labs, generated from reference_impl/tp/tp_attention.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Megatron tensor-parallel attention and transformer block.

The lab "Implement Tensor-Parallel Attention" of the course notes "Week 15 - Tensor Parallelism and
Pipeline Parallelism".

Attention heads are independent, so tp ranks can each compute heads/tp of them, with no
communication, between two linear layers split the Megatron way:

* the fused QKV projection is **column-parallel**, split so that rank r gets the q, k and v
  rows of *its* heads (``blocks=3``: the [q; k; v] blocks are split one by one);
* each rank runs causal attention on its heads only;
* the output projection is **row-parallel**: its input is the concatenation of all heads, and
  rank r holds exactly its heads' slice of it; one all-reduce sums the partial outputs.

The forward pass is ``model.CausalSelfAttention``'s, with ``heads`` = the local heads and the
single-device module's attention kernel (``attention``: ``"explicit"`` or ``"sdpa"``, see
``model.py``; heads are independent, so either kernel runs on a rank's heads alone). A TP
block puts attention and the TP MLP between replicated layernorms: 2 all-reduces forward (one
after attention, one after the MLP) and 2 backward (the input gradients of QKV and of fc1).
"""
from __future__ import annotations

import copy

import torch.distributed as dist
from torch import nn

from reference_impl.model import Block, CausalSelfAttention, attention_core, merge_heads, split_heads
from reference_impl.tp.tp_layers import ColumnParallelLinear, ParallelMLP, RowParallelLinear


class ParallelSelfAttention(CausalSelfAttention):
    """``CausalSelfAttention`` with its heads split over the TP group."""

    # The forward is CausalSelfAttention's steps on this rank's heads, so selective
    # recomputation (memory/recompute.py), which re-implements those steps, may stand in for it.
    forward_is_causal_self_attention = True

    def __init__(self, attention: CausalSelfAttention, group=None):
        nn.Module.__init__(self)
        tp = dist.get_world_size(group)
        if attention.heads % tp:
            raise ValueError(f"heads {attention.heads} is not divisible by the "
                             f"tensor-parallel size tp = {tp}")
        self.attention = attention.attention  # the same kernel ("explicit" or "sdpa")
        raise NotImplementedError('lab3: ParallelSelfAttention.__init__: self.heads, the number of heads this rank computes; self.qkv, the fused [q; k; v] projection split so that this rank holds the q, k and v features of the same heads (its output is 3 blocks: each must be split on its own); self.proj, the output projection, whose input features are the concatenated heads, of which this rank already holds its own slice. Same attribute names as CausalSelfAttention, so the parameters pair up; pass the group on')

    def forward(self, x):
        raise NotImplementedError("lab3: ParallelSelfAttention.forward: x is whole on every rank; from this rank's part of the fused projection take q, k and v of its own heads only (model.split_heads knows the [q; k; v] layout), run the single-device kernel self.attention on them (model.attention_core: heads never look at each other), put the heads back side by side (model.merge_heads) and let the output projection sum every rank's heads into the whole output, its bias once")


class ParallelBlock(Block):
    """``model.Block`` with TP attention and a TP MLP; the layernorms stay whole on every rank."""

    def __init__(self, block: Block, group=None):
        nn.Module.__init__(self)
        tp, hidden = dist.get_world_size(group), block.ln1.normalized_shape[0]
        if hidden % tp:
            raise ValueError(f"hidden size {hidden} is not divisible by the tensor-parallel "
                             f"size tp = {tp}")
        raise NotImplementedError("lab3: ParallelBlock: model.Block's forward runs unchanged on ln1, attn, ln2 and mlp (same names, so the parameters pair up). The layernorms stay whole and replicated: copies of the block's own (sharing the single-device module's parameters would mix the two models' gradients and steps); attention and MLP become their tensor-parallel versions over the group")
