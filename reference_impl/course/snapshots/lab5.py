"""Lab 5's expected values: which elements of a parameter each ZeRO rank owns, written by the
reference.

``owners``: {"numel/N": int64 (N, shard size)}, row r the flat indices of the elements in rank
r's shard (``my_slice`` of 0, 1, ..., numel - 1), -1 where the padding goes; for the sizes of the
ZeRO test's model's parameters (5, 7 and 35 elements) over 1, 2 and 4 ranks.
"""
from __future__ import annotations

import torch
from torch import nn

from reference_impl.hybrid.zero import _ShardedParameter

NUMELS, RANKS = (5, 7, 35), (1, 2, 4)


def make() -> dict:
    owners = {}
    for numel in NUMELS:
        indices = nn.Parameter(torch.arange(1, numel + 1, dtype=torch.float64))
        for ranks in RANKS:
            owners[f"{numel}/{ranks}"] = torch.stack([
                _ShardedParameter(indices, ranks, rank).my_slice(indices).detach().long() - 1
                for rank in range(ranks)])
    return {"owners": owners}
