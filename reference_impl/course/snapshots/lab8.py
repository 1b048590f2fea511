"""Lab 8's expected values: the load-balanced layout, written by the reference.

``chunks``: {"cp": [[first, second] for each rank]}, cp 1 to 16. ``layouts``: {"cp/chunk":
int64 (cp, 2 * chunk), row r the global positions of rank r's tokens in the order it holds
them}, cp 1 to 16 and 1 to 5 tokens per chunk: every layout the public and hidden checks draw.
"""
from __future__ import annotations

import torch

from reference_impl.cp.load_balance import chunks_of_rank, token_positions

CPS, CHUNKS = range(1, 17), range(1, 6)


def make() -> dict:
    chunks = {str(cp): [list(chunks_of_rank(cp, rank)) for rank in range(cp)] for cp in CPS}
    layouts = {f"{cp}/{chunk}": torch.stack([token_positions(2 * cp * chunk, cp, rank)
                                             for rank in range(cp)])
               for cp in CPS for chunk in CHUNKS}
    return {"chunks": chunks, "layouts": layouts}
