"""Cut a model's layers into p contiguous pipeline stages.

Stage i holds layers ``stages[i]`` (a ``range``), in order; every stage gets at least one layer.
:func:`partition` balances a cost per layer (its parameter count from :func:`layer_sizes`, or
a measured time) by minimising the most expensive stage, because a pipeline runs at the pace
of its slowest stage; among the cuts that achieve that minimum it picks the most even one
(least sum of squared stage costs). Or it takes the cut points given, e.g. ``[2, 5]`` for
layers 0-1, 2-4, 5-.

:func:`gpt_layers` flattens ``reference_impl.model.GPT`` into such a list of layers, an
embedding layer, the blocks, and a head (final layernorm + LM head), so that
``nn.Sequential(*gpt_layers(gpt))`` computes what ``gpt`` does and any ``range`` of it is a
stage.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from numbers import Integral

import torch
from torch import nn


def partition(sizes: Sequence[float], p: int,
              cut_points: Sequence[int] | None = None) -> list[range]:
    """Split layers with costs ``sizes`` into ``p`` contiguous stages (see the module)."""
    n = len(sizes)
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError(f"the number of stages p must be an integer >= 1, got {p!r}")
    if p > n:
        raise ValueError(f"cannot split {n} layers into {p} stages: every stage needs a layer")
    if any(size < 0 for size in sizes):
        raise ValueError(f"layer costs must be >= 0, got {list(sizes)}")
    if cut_points is None:
        cut_points = _balanced_cuts(sizes, p)
    cuts = list(cut_points)
    if len(cuts) != p - 1:
        raise ValueError(f"{p} stages need {p - 1} cut points, got {len(cuts)}: {cuts}")
    bounds = [0] + cuts + [n]
    if any(not isinstance(cut, Integral) for cut in cuts) or \
            any(left >= right for left, right in pairwise(bounds)):
        raise ValueError(f"cut points must be strictly increasing integers between 1 and "
                         f"{n - 1} (each the first layer of a stage), got {cuts}")
    return [range(int(left), int(right)) for left, right in pairwise(bounds)]


def _balanced_cuts(sizes: Sequence[float], p: int) -> list[int]:
    """Dynamic programme over (layers so far, stages so far): the cuts minimising
    (largest stage cost, sum of squared stage costs), lexicographically."""
    n = len(sizes)
    prefix = [0.0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    # best[k][i]: the best (max, sum of squares, cuts) for the first i layers in k stages
    best: list[dict[int, tuple[float, float, tuple[int, ...]]]] = [{0: (0.0, 0.0, ())}]
    for k in range(1, p + 1):
        row = {}
        for i in range(k, n - (p - k) + 1):  # leave a layer for every later stage
            options = []
            for j, (worst, squares, cuts) in best[k - 1].items():
                if j < i:
                    cost = prefix[i] - prefix[j]
                    options.append((max(worst, cost), squares + cost * cost,
                                    cuts + ((j,) if k > 1 else ())))
            row[i] = min(options)
        best.append(row)
    return list(best[p][n][2])


def layer_sizes(layers: Sequence[nn.Module]) -> list[int]:
    """The number of parameters of each layer."""
    return [sum(parameter.numel() for parameter in layer.parameters()) for layer in layers]


class GPTEmbedding(nn.Module):
    """The first layer of a GPT: token plus position embeddings (sharing the GPT's modules);
    token embeddings only when ``position_embedding`` is None (rotary positions, which the
    attention applies)."""

    def __init__(self, token_embedding: nn.Embedding, position_embedding: nn.Embedding | None):
        super().__init__()
        self.token_embedding = token_embedding
        self.position_embedding = position_embedding

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(tokens)
        if self.position_embedding is None:
            return x
        return x + self.position_embedding(torch.arange(tokens.shape[1], device=tokens.device))


class GPTHead(nn.Module):
    """The last layer of a GPT: final layernorm, then the LM head (sharing the GPT's modules)."""

    def __init__(self, ln_f: nn.LayerNorm, lm_head: nn.Linear):
        super().__init__()
        self.ln_f = ln_f
        self.lm_head = lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def gpt_layers(gpt: nn.Module) -> list[nn.Module]:
    """``reference_impl.model.GPT`` as a flat list: embedding, each block, head.

    The layers share the GPT's parameters (no copies): a stage built from a slice of the list
    trains the same tensors, and gradients can be compared with the whole model's by name.
    """
    return ([GPTEmbedding(gpt.token_embedding, gpt.position_embedding)] + list(gpt.blocks)
            + [GPTHead(gpt.ln_f, gpt.lm_head)])
