"""Lab 8's expected values: the load-balanced layout, written by the reference.

``chunks``: {"cp": [[first, second] for each rank]}, cp 1 to 16. ``layouts``: {"cp/chunk":
int64 (cp, 2 * chunk), row r the global positions of rank r's tokens in the order it holds
them}, cp 1 to 16 and 1 to 5 tokens per chunk: every layout the public and hidden checks draw.
``visible``: {"cp/chunk": int64 (cp, cp, 5)}, entry [rank, owner] rank's ``visible_part`` of
owner's block as (rows start, rows stop, keys start, keys stop, masked), cp 1 to 8 and 1 to 5
tokens per chunk.
"""
from __future__ import annotations

import torch

from reference_impl.cp.load_balance import chunks_of_rank, token_positions, visible_part

CPS, CHUNKS = range(1, 17), range(1, 6)
VISIBLE_CPS = range(1, 9)


def _visible(cp: int, chunk: int) -> torch.Tensor:
    parts = [[visible_part(cp, rank, owner, 2 * chunk) for owner in range(cp)] for rank in range(cp)]
    return torch.tensor([[[rows.start, rows.stop, keys.start, keys.stop, int(masked)]
                          for rows, keys, masked in row] for row in parts], dtype=torch.int64)


def make() -> dict:
    chunks = {str(cp): [list(chunks_of_rank(cp, rank)) for rank in range(cp)] for cp in CPS}
    layouts = {f"{cp}/{chunk}": torch.stack([token_positions(2 * cp * chunk, cp, rank)
                                             for rank in range(cp)])
               for cp in CPS for chunk in CHUNKS}
    visible = {f"{cp}/{chunk}": _visible(cp, chunk) for cp in VISIBLE_CPS for chunk in CHUNKS}
    return {"chunks": chunks, "layouts": layouts, "visible": visible}
