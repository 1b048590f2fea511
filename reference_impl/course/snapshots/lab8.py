"""Lab 8's expected values: the load-balanced layout, written by the reference.

``chunks``: {"cp": [[first, second] for each rank]}, cp 1 to 16. ``layouts``: {"cp/chunk":
int64 (cp, 2 * chunk), row r the global positions of rank r's tokens in the order it holds
them}, cp 1 to 16 and 1 to 3 tokens per chunk: every layout the public checks draw.
``visible``: {"cp/chunk": int64 (cp, cp, 5)}, entry [rank, owner] rank's ``visible_part`` of
owner's block as (rows start, rows stop, keys start, keys stop, masked), cp 1 to 4 and 1 to 3
tokens per chunk. :func:`make_hidden` gives the same tables for the hidden checks' longer
chunks, 4 and 5 tokens.
"""
from __future__ import annotations

import torch

from reference_impl.cp.load_balance import chunks_of_rank, token_positions, visible_part

CPS, CHUNKS, HIDDEN_CHUNKS = range(1, 17), range(1, 4), range(4, 6)
VISIBLE_CPS = range(1, 5)


def _visible(cp: int, chunk: int) -> torch.Tensor:
    parts = [[visible_part(cp, rank, owner, 2 * chunk) for owner in range(cp)] for rank in range(cp)]
    return torch.tensor([[[rows.start, rows.stop, keys.start, keys.stop, int(masked)]
                          for rows, keys, masked in row] for row in parts], dtype=torch.int64)


def make() -> dict:
    chunks = {str(cp): [list(chunks_of_rank(cp, rank)) for rank in range(cp)] for cp in CPS}
    return {"chunks": chunks, **tables(CHUNKS)}


def make_hidden() -> dict:
    return tables(HIDDEN_CHUNKS)


def tables(chunks) -> dict:
    """The layouts and visible parts for chunks of each length of ``chunks``."""
    layouts = {f"{cp}/{chunk}": torch.stack([token_positions(2 * cp * chunk, cp, rank)
                                             for rank in range(cp)])
               for cp in CPS for chunk in chunks}
    visible = {f"{cp}/{chunk}": _visible(cp, chunk) for cp in VISIBLE_CPS for chunk in chunks}
    return {"layouts": layouts, "visible": visible}
