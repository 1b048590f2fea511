# Student file for the labs, generated from reference_impl/tp/vocab_parallel.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""The vocabulary split over the TP group: embedding, LM head and cross-entropy (Megatron-LM,
Shoeybi et al. 2019, section 3: "parallelize the output embedding GEMM ... fuse the output with
the cross entropy loss", and its vocab-parallel embedding).

Rank r of the TP group holds rows [r V/tp, (r+1) V/tp) of the embedding table and of the LM
head. :class:`VocabParallelEmbedding` looks up the tokens in its range, zeros for the others,
and ``reduce_from_tp`` sums; :class:`ParallelLMHead` leaves the logits split;
:func:`vocab_parallel_cross_entropy` computes the loss from the split logits with three
all-reduces of batch*seq numbers (the global max, the sum of exponentials, the target's logit),
and its backward needs no communication. A vocabulary not divisible by tp is padded to a
multiple of tp (:func:`padded_vocab_size`), the padded logits set to -inf.

The derivation: lab 3's notebook, "5. The loss, split by vocabulary"; the padded rows under
``full_state``: ``docs/library.md``, "Tensor parallelism".
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.tp.tp_collectives import reduce_from_tp
from reference_impl.tp.tp_layers import ColumnParallelLinear, sharded_parameter


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """The smallest multiple of tp that holds the vocabulary."""
    return -(-vocab_size // tp) * tp


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended along dim 0, up to ``rows`` rows."""
    padding = tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])
    return torch.cat([tensor.detach(), padding])


def _vocab_range(local_size: int, group) -> tuple[int, int]:
    """The [start, end) of the (padded) vocabulary this rank holds."""
    raise NotImplementedError('lab3: _vocab_range (hint: "split by vocabulary" in the notebook)')


class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` with its rows (the vocabulary) split over the TP group. Only the table
    is kept (not padding_idx, max_norm and the like)."""

    def __init__(self, embedding: nn.Embedding, group=None):
        super().__init__()
        raise NotImplementedError('lab3: VocabParallelEmbedding.__init__ (hint: "split by vocabulary" in the notebook)')

    def forward(self, tokens):
        raise NotImplementedError('lab3: VocabParallelEmbedding.forward (hint: "split by vocabulary" in the notebook)')


class ParallelLMHead(ColumnParallelLinear):
    """The LM head split over the (padded) vocabulary; returns this rank's slice of the logits,
    for ``vocab_parallel_cross_entropy(logits, targets, group, vocab_size=head.vocab_size)``."""

    def __init__(self, linear: nn.Linear, group=None):
        raise NotImplementedError('lab3: ParallelLMHead.__init__ (hint: "split by vocabulary" in the notebook)')


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, targets, vocab_size, group):
        raise NotImplementedError('lab3: _VocabParallelCrossEntropy.forward (hint: "the loss forward" in the notebook)')
        ctx.dtype = local_logits.dtype
        return losses

    @staticmethod
    def backward(ctx, grad_loss):
        raise NotImplementedError('lab3: _VocabParallelCrossEntropy.backward (hint: "the loss backward" in the notebook)')
        return grad.to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, targets: torch.Tensor, group=None,
                                 vocab_size: int | None = None) -> torch.Tensor:
    """The cross-entropy of every token (shape of ``targets``; ``.mean()`` is
    ``F.cross_entropy``'s default), from this rank's slice (..., V_padded / tp) of the logits.

    ``vocab_size``: the real vocabulary, when the logits were padded to a multiple of tp; the
    logits past it are ignored. Every rank returns the same losses. Collective over the group.
    """
    if vocab_size is None:
        vocab_size = local_logits.shape[-1] * dist.get_world_size(group)
    return _VocabParallelCrossEntropy.apply(local_logits, targets, vocab_size, group)
