"""Seeded tensors and the toy model the checks train: the same tensor for the same seed on every
rank and device, and a model small enough for 8 CPU ranks with every kind of parameter (graded
and library tests alike)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.model import MLP

VOCAB, HIDDEN, SEQ, BATCH = 32, 16, 8, 8


def random(shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    """The same normal tensor for the same seed on every rank and device: drawn on the CPU
    from its own generator, then moved to this rank's device."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(current_device())


class Toy(nn.Module):
    """Replicated embedding, a linear layer (the one a test distributes), an MLP, layernorm,
    head: small enough to train on 8 CPU ranks, big enough that every kind of parameter has a
    gradient to check."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.fc = nn.Linear(HIDDEN, HIDDEN)
        self.ln = nn.LayerNorm(HIDDEN)
        self.mlp = MLP(HIDDEN, 2 * HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        x = torch.tanh(self.fc(self.embedding(tokens)))
        return self.head(self.ln(x + self.mlp(x)))


def toy_and_batch():
    """The toy (seeded) and one batch of ``BATCH`` x ``SEQ`` tokens and targets, on the CPU."""
    torch.manual_seed(1)
    toy = Toy()
    generator = torch.Generator().manual_seed(5)
    tokens, targets = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
                       for _ in range(2))
    return toy, tokens, targets


def toy_loss(model, tokens, targets):
    return F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))


def toy_grads() -> dict:
    """The single-device toy's gradients on its batch: the oracle of the data-parallel tests."""
    toy, tokens, targets = toy_and_batch()
    toy_loss(toy, tokens, targets).backward()
    return {name: p.grad.clone() for name, p in toy.named_parameters()}

