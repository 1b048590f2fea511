"""Lab 2's expected values: which entries of a split dimension each TP rank holds.

``positions``: {"rows/blocks/tp": [rank 0's entries, rank 1's, ...]}, the entries of a
dimension of ``rows`` made of ``blocks`` blocks that the reference's ``shard`` gives each of
``tp`` ranks, for every such split of up to ``ROWS`` entries.
"""
from __future__ import annotations

import torch

from reference_impl.tp.tp_layers import shard

ROWS = 48
BLOCKS = (1, 2, 3)
TP_SIZES = (1, 2, 3, 4)


def make() -> dict:
    positions = {}
    for rows in range(1, ROWS + 1):
        numbered = torch.arange(rows)
        for blocks in BLOCKS:
            for tp in TP_SIZES:
                if rows % (blocks * tp) == 0:
                    positions[f"{rows}/{blocks}/{tp}"] = [
                        shard(numbered, 0, rank, tp, blocks).tolist() for rank in range(tp)]
    return {"positions": positions}
