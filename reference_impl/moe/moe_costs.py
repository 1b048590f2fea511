"""What expert parallelism costs, from the routing counts: the all-to-all bytes each rank
sends, and how unevenly the experts are loaded.

All-to-all bytes of the dispatch and combine, forward and backward (GShard, Lepikhin et al.
2020, section 3), and the load imbalance max_e / mean_e of the tokens per expert (1 when
balanced; the Switch auxiliary loss pushes it towards 1). The formulas: docs/library.md,
'Beyond the three dimensions'.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AllToAllBytes:
    """Bytes one rank sends to the other ranks of its EP group, per exchange."""

    dispatch_forward: int
    combine_forward: int
    dispatch_backward: int
    combine_backward: int

    @property
    def forward(self) -> int:
        return self.dispatch_forward + self.combine_forward

    @property
    def backward(self) -> int:
        return self.dispatch_backward + self.combine_backward


def tokens_to_ranks(tokens_per_expert: Sequence[int], ep: int) -> list[int]:
    """The tokens a rank sends to each rank of its EP group: its tokens per expert summed over
    each rank's E/ep consecutive experts."""
    if len(tokens_per_expert) % ep:
        raise ValueError(f"{len(tokens_per_expert)} experts are not divisible by ep = {ep}")
    per_rank = len(tokens_per_expert) // ep
    return [sum(tokens_per_expert[d * per_rank:(d + 1) * per_rank]) for d in range(ep)]


def all_to_all_bytes(tokens_per_expert_by_rank: Sequence[Sequence[int]], rank: int, hidden: int,
                     bytes_per_element: int = 4) -> AllToAllBytes:
    """The formula of docs/library.md for ``rank`` (its index in the EP group), from every
    EP rank's kept tokens per expert (``Routing.tokens_per_expert``), in EP-rank order."""
    ep = len(tokens_per_expert_by_rank)
    n = [tokens_to_ranks(counts, ep) for counts in tokens_per_expert_by_rank]
    leaving = sum(n[rank][d] for d in range(ep) if d != rank)      # its tokens, to other ranks
    computed = sum(n[s][rank] for s in range(ep) if s != rank)     # others' tokens, computed here
    row = hidden * bytes_per_element
    return AllToAllBytes(dispatch_forward=leaving * row, combine_forward=computed * row,
                         dispatch_backward=computed * row, combine_backward=leaving * row)


def relative_load(tokens_per_expert: Sequence[int]) -> list[float]:
    """Each expert's tokens over the mean tokens per expert (1.0 everywhere when balanced)."""
    mean = sum(tokens_per_expert) / len(tokens_per_expert)
    if mean == 0:
        raise ValueError("no tokens were routed: the load of the experts is undefined")
    return [count / mean for count in tokens_per_expert]


def load_imbalance(tokens_per_expert: Sequence[int]) -> float:
    """max / mean of the tokens per expert: 1.0 when balanced, E when one expert gets all."""
    return max(relative_load(tokens_per_expert))
