"""Lab 4's expected values: the orders and the activations in flight of GPipe and 1F1B, written by
the reference.

``orders``: {"generator/p/m": [each rank's passes, "F0 F1 B0 ..."]} for the sizes whose order
the public checks compare; ``bubbles``: {"p/m": [GPipe's bubble fraction, its makespan]},
simulated with T_F = 1 and T_B = 2 (1F1B's are the same), for the sizes the checks simulate.
``warm_up`` and ``peaks``: {"p/m": [per rank]} of 1F1B, the forwards each rank runs before its
first backward and the most microbatches whose activations it holds at once, for the sizes
whose orders and peaks the public checks compare (the hidden checks' from :func:`make_hidden`).
None holds the size the notebook's exercise 4 asks about (p = 4, m = 6).
"""
from __future__ import annotations

from reference_impl.pipeline.pipeline_schedules import gpipe, one_f_one_b
from reference_impl.pipeline.pipeline_simulator import simulate

ORDERED = [("gpipe", 1, 3), ("gpipe", 2, 3), ("gpipe", 3, 2), ("one_f_one_b", 1, 3),
           ("one_f_one_b", 2, 3), ("one_f_one_b", 3, 4), ("one_f_one_b", 4, 2),
           ("one_f_one_b", 4, 5)]
PEAKED = [(1, 3), (2, 5), (3, 2), (4, 4), (4, 8), (5, 9)]
PEAKED_HIDDEN = [(6, 3), (3, 7), (6, 11), (7, 2)]  # make_hidden's
BUBBLES = [(1, 4), (2, 1), (2, 5), (3, 3), (4, 2), (4, 8), (5, 9)]  # (p, m) the checks simulate
BUBBLES_HIDDEN = [(6, 3), (3, 7), (6, 11), (2, 12)]


def _forwards_first(passes: str) -> int:
    kinds = [action[0] for action in passes.split()]
    return kinds.index("B") if "B" in kinds else len(kinds)


def make() -> dict:
    generators = {"gpipe": gpipe, "one_f_one_b": one_f_one_b}
    orders = {}
    for name, p, m in ORDERED:
        schedule = generators[name](p, m)
        orders[f"{name}/{p}/{m}"] = [schedule.format(rank) for rank in range(p)]
    return {"orders": orders, "bubbles": bubbles(BUBBLES),
            **in_flight(sorted({*PEAKED, *((p, m) for _, p, m in ORDERED)}))}


def make_hidden() -> dict:
    return {"bubbles": bubbles(BUBBLES_HIDDEN), **in_flight(PEAKED_HIDDEN)}


def bubbles(sizes) -> dict:
    """GPipe's simulated (bubble fraction, makespan) with T_F = 1, T_B = 2, per (p, m)."""
    found = {}
    for p, m in sizes:
        timeline = simulate(gpipe(p, m), cost_f=1.0, cost_b=2.0)
        found[f"{p}/{m}"] = [timeline.bubble_fraction, timeline.makespan]
    return found


def in_flight(sizes) -> dict:
    """1F1B's warm-up and peak in flight per rank, for each (p, m) of ``sizes``."""
    warm_up, peaks = {}, {}
    for p, m in sizes:
        schedule = one_f_one_b(p, m)
        warm_up[f"{p}/{m}"] = [_forwards_first(schedule.format(rank))
                               for rank in range(p)]
        peaks[f"{p}/{m}"] = list(simulate(schedule).peak_in_flight)
    return {"warm_up": warm_up, "peaks": peaks}
