"""The vocabulary-parallel embedding, LM head and cross-entropy against nn.Embedding, nn.Linear and
F.cross_entropy on the whole vocabulary: tp 1, 2 and 4, a vocabulary divisible by tp (64), one
that is not (61: padded to 64 on tp 4), and one so small that a rank holds only padding (6 on
tp 4: padded to 8, rank 3 holds rows 6 and 7). The logits are scaled so that a naive exp
overflows fp32.

Tolerance (fp32): atol = rtol = 1e-6 throughout. Measured on CPU: the embedding is exact (each
token's row plus zeros); the loss, of the order of the logits (hundreds), is within 2e-5 (1e-7
relative); gradients within 1e-6.
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.checks import assert_close
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.tp.tp_layers import full_state
from reference_impl.tp.vocab_parallel import (ParallelLMHead, VocabParallelEmbedding,
                                           padded_vocab_size, vocab_parallel_cross_entropy)
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-6, rtol=1e-6)
BATCH, SEQ, HIDDEN = 2, 8, 16
SCALE = 100.0  # logits of a few hundred: exp overflows fp32 above ~88.7
CASES = [(1, 64), (2, 64), (4, 64), (1, 61), (2, 61), (4, 61), (4, 6)]
IDS = [f"tp{tp}-vocab{vocab}" for tp, vocab in CASES]


def tokens(vocab, seed):
    """Random tokens, with the first and last of the vocabulary among them."""
    generator = torch.Generator().manual_seed(seed)
    result = torch.randint(vocab, (BATCH, SEQ), generator=generator)
    result[0, :2] = torch.tensor([0, vocab - 1])
    return result.to(current_device())


def checked(pairs):
    return [(what, a.detach().cpu(), b.detach().cpu()) for what, a, b in pairs]


def assert_pairs(results):
    for rank, pairs in enumerate(results):
        for what, parallel, reference in pairs:
            assert_close(parallel, reference, what, rank=rank, **TOLERANCE)


def test_padded_vocab_size():
    assert [padded_vocab_size(v, tp) for v, tp in [(64, 4), (61, 4), (61, 2), (6, 4), (5, 1)]] == [
        64, 64, 62, 8, 5]


# ------------------------------------------------------------------------------ embedding

def embedding_pairs(vocab):
    torch.manual_seed(0)
    reference = nn.Embedding(vocab, HIDDEN).to(current_device())
    parallel = VocabParallelEmbedding(copy.deepcopy(reference))
    ids = tokens(vocab, seed=1)
    upstream = random((BATCH, SEQ, HIDDEN), seed=2)
    outputs = [module(ids) for module in (parallel, reference)]
    for output in outputs:
        output.backward(upstream)
    table_grad = full_state(parallel, grads=True)["weight"]
    padded = padded_vocab_size(vocab, dist.get_world_size())
    return checked([
        ("embedding output", *outputs),
        ("grad of the table", table_grad[:vocab], reference.weight.grad),
        ("grad of the padded rows", table_grad[vocab:], torch.zeros(padded - vocab, HIDDEN)),
    ])


@pytest.mark.parametrize("tp, vocab", CASES, ids=IDS)
def test_vocab_parallel_embedding_matches_nn_embedding(run_on_ranks, tp, vocab):
    assert_pairs(run_on_ranks(embedding_pairs, tp, vocab))


# -------------------------------------------------------------------------- cross-entropy

def cross_entropy_pairs(vocab):
    tp, rank = dist.get_world_size(), dist.get_rank()
    padded = padded_vocab_size(vocab, tp)
    logits = random((BATCH, SEQ, vocab), seed=3, scale=SCALE)
    targets = tokens(vocab, seed=4)
    # The padded logits get values that would dominate the loss if they were not masked out.
    garbage = torch.full((BATCH, SEQ, padded - vocab), 10 * SCALE, device=logits.device)
    local = torch.cat([logits, garbage], -1).chunk(tp, -1)[rank].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(local, targets, vocab_size=vocab).mean()
    loss.backward()

    full = logits.clone().requires_grad_()
    reference = F.cross_entropy(full.flatten(0, 1), targets.flatten())
    reference.backward()
    expected_grad = F.pad(full.grad, (0, padded - vocab)).chunk(tp, -1)[rank]
    return checked([("loss", loss, reference), ("grad of my logits", local.grad, expected_grad)])


@pytest.mark.parametrize("tp, vocab", CASES, ids=IDS)
def test_vocab_parallel_cross_entropy_matches_f_cross_entropy(run_on_ranks, tp, vocab):
    assert torch.isinf(random((BATCH, SEQ, vocab), seed=3, scale=SCALE).exp()).any(), (
        "the logits are too small to show that a naive softmax overflows")
    assert_pairs(run_on_ranks(cross_entropy_pairs, tp, vocab))


def cross_entropy_collectives(vocab):
    tp, rank = dist.get_world_size(), dist.get_rank()
    local = random((BATCH, SEQ, vocab), seed=3).chunk(tp, -1)[rank].requires_grad_()
    with CommTracer() as forward:
        loss = vocab_parallel_cross_entropy(local, tokens(vocab, seed=4)).mean()
    with CommTracer() as backward:
        loss.backward()
    return [(call.op, call.nbytes) for call in forward.calls], backward.count()


def test_cross_entropy_moves_three_numbers_per_token_not_the_logits(run_on_ranks):
    per_token = BATCH * SEQ * 4  # one fp32 number per token
    for rank, (forward, backward) in enumerate(run_on_ranks(cross_entropy_collectives, 4, 64)):
        assert forward == [("all_reduce", per_token)] * 3, f"rank {rank}: {forward}"
        assert backward == 0, f"rank {rank}: the backward should not communicate"


# --------------------------------------------------------------- LM head + cross-entropy

def lm_head_pairs(vocab):
    torch.manual_seed(0)
    reference = nn.Linear(HIDDEN, vocab, bias=False).to(current_device())  # as GPT's lm_head
    head = ParallelLMHead(copy.deepcopy(reference))
    targets = tokens(vocab, seed=4)
    hidden = {name: random((BATCH, SEQ, HIDDEN), seed=5, scale=10.0).requires_grad_()
              for name in ("parallel", "reference")}
    loss = vocab_parallel_cross_entropy(head(hidden["parallel"]), targets,
                                        vocab_size=head.vocab_size).mean()
    expected = F.cross_entropy(reference(hidden["reference"]).flatten(0, 1), targets.flatten())
    for value in (loss, expected):
        value.backward()
    weight_grad = full_state(head, grads=True)["weight"]
    return checked([
        ("loss", loss, expected),
        ("grad of the hidden states", hidden["parallel"].grad, hidden["reference"].grad),
        ("grad of the head", weight_grad[:vocab], reference.weight.grad),
        ("grad of the padded rows", weight_grad[vocab:], torch.zeros_like(weight_grad[vocab:])),
    ])


@pytest.mark.parametrize("tp, vocab", CASES, ids=IDS)
def test_parallel_lm_head_and_loss_match_the_single_device(run_on_ranks, tp, vocab):
    assert_pairs(run_on_ranks(lm_head_pairs, tp, vocab))
