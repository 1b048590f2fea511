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
    # BEGIN SOLUTION lab3: _vocab_range (hint: "split by vocabulary" in the notebook)
    start = dist.get_rank(group) * local_size
    return start, start + local_size
    # END SOLUTION


class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` with its rows (the vocabulary) split over the TP group. Only the table
    is kept (not padding_idx, max_norm and the like)."""

    def __init__(self, embedding: nn.Embedding, group=None):
        super().__init__()
        # BEGIN SOLUTION lab3: VocabParallelEmbedding.__init__ (hint: "split by vocabulary" in the notebook)
        self.group, self.vocab_size = group, embedding.num_embeddings
        rows = padded_vocab_size(self.vocab_size, dist.get_world_size(group))
        self.weight = sharded_parameter(_pad_rows(embedding.weight, rows), 0, group)
        # END SOLUTION

    def forward(self, tokens):
        # BEGIN SOLUTION lab3: VocabParallelEmbedding.forward (hint: "split by vocabulary" in the notebook)
        start, end = _vocab_range(self.weight.shape[0], self.group)
        elsewhere = (tokens < start) | (tokens >= end)  # another rank holds their rows
        local = F.embedding((tokens - start).masked_fill(elsewhere, 0), self.weight)
        return reduce_from_tp(local.masked_fill(elsewhere.unsqueeze(-1), 0.0), self.group)
        # END SOLUTION


class ParallelLMHead(ColumnParallelLinear):
    """The LM head split over the (padded) vocabulary; returns this rank's slice of the logits,
    for ``vocab_parallel_cross_entropy(logits, targets, group, vocab_size=head.vocab_size)``."""

    def __init__(self, linear: nn.Linear, group=None):
        # BEGIN SOLUTION lab3: ParallelLMHead.__init__ (hint: "split by vocabulary" in the notebook)
        rows = padded_vocab_size(linear.out_features, dist.get_world_size(group))
        padded = nn.Linear(linear.in_features, rows, bias=linear.bias is not None,
                           device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            for name, parameter in padded.named_parameters():
                parameter.copy_(_pad_rows(getattr(linear, name), rows))
        super().__init__(padded, group)
        self.vocab_size = linear.out_features
        # END SOLUTION


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, targets, vocab_size, group):
        # BEGIN SOLUTION lab3: _VocabParallelCrossEntropy.forward (hint: "the loss forward" in the notebook)
        start, end = _vocab_range(local_logits.shape[-1], group)
        padding = torch.arange(start, end, device=local_logits.device) >= vocab_size
        logits = local_logits.float().masked_fill(padding, float("-inf"))
        maximum = logits.max(dim=-1).values
        dist.all_reduce(maximum, op=dist.ReduceOp.MAX, group=group)
        exp = (logits - maximum.unsqueeze(-1)).exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)

        mine = (targets >= start) & (targets < end)  # this rank holds the target's logit
        local_targets = (targets - start).masked_fill(~mine, 0)
        target_logit = logits.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1) - maximum
        target_logit = target_logit.masked_fill(~mine, 0.0)
        dist.all_reduce(target_logit, group=group)

        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), mine, local_targets)
        losses = sum_exp.log() - target_logit
        # END SOLUTION
        ctx.dtype = local_logits.dtype
        return losses

    @staticmethod
    def backward(ctx, grad_loss):
        # BEGIN SOLUTION lab3: _VocabParallelCrossEntropy.backward (hint: "the loss backward" in the notebook)
        softmax, mine, local_targets = ctx.saved_tensors
        one_hot = F.one_hot(local_targets, softmax.shape[-1]) * mine.unsqueeze(-1)
        grad = (softmax - one_hot) * grad_loss.unsqueeze(-1)
        # END SOLUTION
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
