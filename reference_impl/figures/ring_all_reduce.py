"""The ring all-reduce, step by step: what every rank holds of every chunk.

:func:`ring_all_reduce_states` replays the index arithmetic of ``collectives.py`` with sets
instead of tensors (no process group needed): holding[r][c] is the set of ranks whose chunk c
has been summed into rank r's copy of chunk c. :func:`plot_ring_all_reduce` draws one panel
per step, ranks as rows and chunks as columns; :func:`plot_ring_step` draws one step as a ring
(one slide per step): what each rank sends to its right neighbour and what every rank then holds.
"""
from __future__ import annotations

import math

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, Rectangle

from reference_impl.figures.style import (BLUE, GREY_33, HIGHLIGHT, ORANGE, PALE_BLUE, PARTIAL_SUMS,
                                          hide_spines, new_figure)


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
    figure = new_figure(max(10, 1.75 * len(states)), 0.4 * n + 1.3)
    figure.suptitle(f"Ring all-reduce on {n} ranks: {n - 1} reduce-scatter steps, then "
                    f"{n - 1} all-gather steps\neach cell: {'the' if n <= 4 else 'how many'} "
                    "ranks summed into that chunk (Σ = all);  red outline: just received from "
                    "the left neighbour", fontsize=12)
    colours = colormaps[PARTIAL_SUMS]
    for index, (axes, (label, holding, received)) in enumerate(
            zip(figure.subplots(1, len(states)), states)):
        for rank in range(n):
            for chunk in range(n):
                members = holding[rank][chunk]
                full, new = len(members) == n, (rank, chunk) in received
                shade = 0.15 + 0.45 * (len(members) - 1) / max(1, n - 2)
                axes.add_patch(Rectangle(
                    (chunk, rank), 1, 1, facecolor=ORANGE if full else colours(shade),
                    edgecolor=HIGHLIGHT if new else "white", linewidth=2.5 if new else 1,
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
        hide_spines(axes)
    return figure


def plot_ring_step(n: int = 4, step: int = 0) -> Figure:
    """Step ``step`` of the 2(n-1) (0 = before the first): ranks on a circle, each with its n
    chunks (number of ranks summed in, Σ when complete), an arrow per send labelled by chunk."""
    states = ring_all_reduce_states(n)
    if not 0 <= step < len(states):
        raise ValueError(f"a ring all-reduce on {n} ranks has steps 0..{len(states) - 1}, got {step}")
    label, holding, received = states[step]
    figure = new_figure(9, 5.6)
    axes = figure.subplots()
    axes.set_xlim(-2.9, 2.9)
    axes.set_ylim(-1.95, 1.95)
    axes.set_aspect("equal")
    axes.axis("off")
    axes.set_title(label.replace("\n", ": ") + f"   ({step} of {len(states) - 1})", fontsize=18)
    centres = [(1.25 * math.sin(2 * math.pi * r / n), 1.25 * math.cos(2 * math.pi * r / n))
               for r in range(n)]
    sent = {rank: chunk for rank, chunk in received}  # receiver -> chunk
    for rank, (x, y) in enumerate(centres):
        right = (rank + 1) % n
        if right in sent:
            tx, ty = centres[right]
            axes.add_patch(FancyArrowPatch((x, y), (tx, ty), connectionstyle="arc3,rad=-0.25",
                                           arrowstyle="-|>", mutation_scale=22, linewidth=2.5,
                                           color=HIGHLIGHT, shrinkA=40, shrinkB=40))
            mx, my = (x + tx) / 2, (y + ty) / 2
            axes.text(mx * 1.45, my * 1.45, f"chunk {sent[right]}", ha="center", va="center",
                      fontsize=14, color=HIGHLIGHT)
        axes.add_patch(Circle((x, y), 0.16, color=BLUE))
        axes.text(x, y, str(rank), ha="center", va="center", fontsize=15, color="white")
        width = 0.34
        for chunk in range(n):
            members = holding[rank][chunk]
            full, new = len(members) == n, (rank, chunk) in received
            left = x - n * width / 2 + chunk * width
            top = y + (0.25 if y >= 0 else -0.25 - width)
            axes.add_patch(Rectangle((left, top), width * 0.92, width * 0.92,
                                     facecolor=ORANGE if full else PALE_BLUE,
                                     edgecolor=HIGHLIGHT if new else GREY_33,
                                     linewidth=2.5 if new else 0.8))
            axes.text(left + width * 0.46, top + width * 0.46, "Σ" if full else str(len(members)),
                      ha="center", va="center", fontsize=13)
    return figure
