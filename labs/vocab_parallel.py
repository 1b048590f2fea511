# Student file for the labs, generated from reference_impl/tp/vocab_parallel.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""The vocabulary split over the TP group: embedding, LM head and cross-entropy (Megatron-LM,
Shoeybi et al. 2019, section 3: "parallelize the output embedding GEMM ... fuse the output with
the cross entropy loss", and its vocab-parallel embedding).

The vocabulary is a GPT's largest dimension (50k rows of ``hidden`` in the embedding table and
again in the LM head). Rank r of the TP group holds rows [r V/tp, (r+1) V/tp) of both:

* :class:`VocabParallelEmbedding` looks up the tokens in its range, writes zeros for the others,
  and ``reduce_from_tp`` (all-reduce) sums: exactly one rank contributed each token's row.
* :class:`ParallelLMHead` is a column-parallel linear over the vocabulary; its output, the
  logits, stays split: gathering batch*seq*V floats would cost far more than the loss.
* :func:`vocab_parallel_cross_entropy` computes the loss from the split logits l with three
  all-reduces of batch*seq numbers, never the logits themselves:

      m    = max over ranks of the local max of l           all-reduce MAX
      S    = sum over ranks of sum_v exp(l_v - m)           all-reduce SUM
      t    = l_target - m on the rank holding the target,   all-reduce SUM
             0 on the others
      loss = log S - t

  Subtracting the global max m keeps exp from overflowing (fp32 exp overflows above ~88).
  Backward needs no communication: d loss / d l = softmax(l) - one_hot(target), which each rank
  computes on its own slice from the saved exp(l - m) / S.

**A vocabulary not divisible by tp** is padded up to the next multiple of tp
(:func:`padded_vocab_size`): the embedding table and the head get zero rows at the end. No token
looks up a padded row, and the cross-entropy, told the real ``vocab_size``, sets the padded
logits to -inf, so exp(-inf - m) = 0: they change neither the loss nor any gradient (theirs is
0). Gathered (``tp_layers.full_state``), the sharded weights have the padded shape; their first
``vocab_size`` rows are the single-device ones.
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
