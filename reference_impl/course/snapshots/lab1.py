"""Lab 1's expected values: rank layouts and their grids, written by the reference.

A layout is stored as rows, one per rank (int8): the index of the rank's group of each kind of
:data:`KINDS` among that kind's groups (sorted; -1 for a kind the layout does not have), then
its coordinates :data:`COORDINATES`. ``layouts`` (the public checks) and ``layouts_more`` (the
hidden ones, from :func:`make_hidden`): {"rows": every layout's rows, one after the other,
"keys": ["W/tp/pp/cp/order", ...] in that order, "names": [the grid's dimensions, slowest
first, "rdp-tp-pp", ...]}, the order written as its axes, fastest first ("pp-tp-rdp").
``layouts``: every world size 1 to 16, every tp, pp and cp (1 to 4) that divide it, every
order; ``layouts_more``: a few world sizes from 18 to 64.

``positions`` and ``positions_more``: mixed-radix numberings over other axes than a layout's,
{"case": {"axes": [...], "sizes": [...], "positions": [[digit per axis] for each rank],
"groups": {"axis,axis": [[ranks], ...]}}} (the groups along every set of axes).
"""
from __future__ import annotations

import itertools
from math import prod

import torch

from reference_impl.comm.groups import (AXES, build_rank_layout, groups_along, rank_mesh,
                                        rank_positions)

ORDERS = ["-".join(axes) for axes in itertools.permutations(AXES)]
SMALL = range(1, 17)
CPS = (1, 2, 3, 4)
MORE = [(18, 3, 2, 1), (18, 2, 1, 3), (20, 2, 5, 1), (20, 5, 2, 2), (24, 4, 3, 1),
        (24, 2, 3, 2), (24, 3, 2, 4), (25, 5, 1, 1), (27, 3, 3, 1), (28, 7, 2, 1),
        (30, 3, 5, 1), (30, 5, 1, 2), (32, 4, 2, 1), (32, 8, 4, 1), (32, 2, 2, 4),
        (36, 6, 3, 1), (36, 3, 2, 2), (48, 4, 4, 1), (48, 2, 6, 2), (64, 8, 2, 1),
        (64, 4, 4, 2), (64, 2, 8, 1)]  # (world size, tp, pp, cp)
KINDS = ("TP", "PP", "DP", "RDP", "MP", "WORLD", "CP", "RDP_CP")
COORDINATES = ("tp_rank", "pp_rank", "rdp_rank", "dp_rank", "mp_rank", "cp_rank")
POSITIONS = {"two axes": (("a", "b"), (3, 2)), "one axis": (("only",), (5,)),
             "a size of one": (("x", "y", "z"), (2, 1, 3)),
             "four axes": (("tp", "cp", "rdp", "pp"), (2, 2, 3, 2))}
POSITIONS_MORE = {"five axes": (("e", "d", "c", "b", "a"), (2, 3, 1, 2, 2)),
                  "a long axis": (("u", "v"), (7, 3)),
                  "three axes": (("pp", "rdp", "tp"), (3, 2, 4))}


def layout_rows(world_size: int, tp: int, pp: int, cp: int, order: str) -> list[list[int]]:
    layout = build_rank_layout(world_size, tp, pp, order, cp)
    found = {kind: groups for kind, groups in layout.groups.items()}
    return [[next((i for i, group in enumerate(found[kind]) if rank in group), -1)
             if kind in found else -1 for kind in KINDS]
            + [getattr(layout.ranks[rank], name) for name in COORDINATES]
            for rank in range(world_size)]


def layouts(configs) -> dict:
    keys, rows, names = [], [], []
    for w, tp, pp, cp in configs:
        for order in ORDERS:
            keys.append(f"{w}/{tp}/{pp}/{cp}/{order}")
            rows += layout_rows(w, tp, pp, cp, order)
            names.append("-".join(rank_mesh(build_rank_layout(w, tp, pp, order, cp))[1]))
    return {"rows": torch.tensor(rows, dtype=torch.int8), "keys": keys, "names": names}


def small_configs():
    return [(w, tp, pp, cp) for w in SMALL for cp in CPS for tp in range(1, w + 1)
            for pp in range(1, w + 1) if w % (tp * pp * cp) == 0]


def more_configs():
    return MORE


def numbering(axes: tuple[str, ...], sizes: tuple[int, ...]) -> dict:
    world = prod(sizes)
    positions = rank_positions(world, dict(zip(axes, sizes)), axes)
    subsets = [subset for n in range(len(axes) + 1) for subset in itertools.combinations(axes, n)]
    return {"axes": list(axes), "sizes": list(sizes),
            "positions": [[position[axis] for axis in axes] for position in positions],
            "groups": {",".join(subset): [list(group) for group in groups_along(positions, subset)]
                       for subset in subsets}}


def make() -> dict:
    return {"layouts": layouts(small_configs()),
            "positions": {case: numbering(*spec) for case, spec in POSITIONS.items()}}


def make_hidden() -> dict:
    return {"layouts_more": layouts(more_configs()),
            "positions_more": {case: numbering(*spec) for case, spec in POSITIONS_MORE.items()}}
