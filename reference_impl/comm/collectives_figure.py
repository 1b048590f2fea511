"""The ring all-reduce, step by step: what every rank holds of every chunk.

:func:`ring_all_reduce_states` replays the index arithmetic of ``collectives.py`` with sets
instead of tensors (no process group needed): holding[r][c] is the set of ranks whose chunk c
has been summed into rank r's copy of chunk c. :func:`plot_ring_all_reduce` draws one panel
per step, ranks as rows and chunks as columns.
"""
from __future__ import annotations

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


def ring_all_reduce_states(n: int) -> list[tuple[str, list[list[frozenset]], set]]:
    """(label, holding, received) before the first step and after each of the 2(n-1) steps.

    ``received`` is the set of (rank, chunk) pairs that rank received from its left neighbour in
    that step (added in during reduce-scatter, copied over during all-gather).
    """
    if n < 2:
        raise ValueError(f"a ring needs at least 2 ranks, got n={n}")
    holding = [[frozenset({rank}) for _ in range(n)] for rank in range(n)]
    states = [("start\n(own data only)", holding, set())]
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            before, holding = holding, [list(row) for row in holding]
            received = set()
            for rank in range(n):  # every rank sends at once; receivers see the old state
                right = (rank + 1) % n
                if phase == "reduce-scatter":  # send chunk (r - s), receiver adds it in
                    chunk = (rank - step) % n
                    holding[right][chunk] = before[right][chunk] | before[rank][chunk]
                else:  # send complete chunk (r + 1 - s), receiver overwrites its copy
                    chunk = (rank + 1 - step) % n
                    holding[right][chunk] = before[rank][chunk]
                received.add((right, chunk))
            states.append((f"{phase}\nstep {step + 1}", holding, received))
    return states


def plot_ring_all_reduce(n: int = 4) -> Figure:
    """One panel per step: cell (rank, chunk) lists the ranks summed in (for n > 4: how many),
    Σ when complete; outlined: just received."""
    states = ring_all_reduce_states(n)
    figure = Figure(figsize=(max(10, 1.75 * len(states)), 0.4 * n + 1.3), layout="constrained")
    figure.suptitle(f"Ring all-reduce on {n} ranks: {n - 1} reduce-scatter steps, then "
                    f"{n - 1} all-gather steps\neach cell: {'the' if n <= 4 else 'how many'} "
                    "ranks summed into that chunk (Σ = all);  red outline: just received from "
                    "the left neighbour", fontsize=12)
    colours = colormaps["Blues"]
    for index, (axes, (label, holding, received)) in enumerate(
            zip(figure.subplots(1, len(states)), states)):
        for rank in range(n):
            for chunk in range(n):
                members = holding[rank][chunk]
                full, new = len(members) == n, (rank, chunk) in received
                shade = 0.15 + 0.45 * (len(members) - 1) / max(1, n - 2)
                axes.add_patch(Rectangle(
                    (chunk, rank), 1, 1, facecolor="#f28e2b" if full else colours(shade),
                    edgecolor="#d62728" if new else "white", linewidth=2.5 if new else 1,
                    zorder=2 if new else 1))
                text = "".join(map(str, sorted(members))) if n <= 4 else str(len(members))
                axes.text(chunk + 0.5, rank + 0.5, "Σ" if full else text,
                          ha="center", va="center", fontsize=10 if n <= 4 else 8,
                          fontweight="bold" if full else "normal",
                          color="white" if full or shade > 0.4 else "black", zorder=3)
        axes.set_xlim(0, n)
        axes.set_ylim(n, 0)
        axes.set_aspect("equal")
        axes.set_title(label, fontsize=10)
        axes.set_xticks([c + 0.5 for c in range(n)], [str(c) for c in range(n)], fontsize=8)
        axes.set_xlabel("chunk", fontsize=8, labelpad=1)
        axes.set_yticks([r + 0.5 for r in range(n)],
                        [f"rank {r}" for r in range(n)] if index == 0 else [], fontsize=8)
        axes.tick_params(length=0)
        for spine in axes.spines.values():
            spine.set_visible(False)
    return figure
