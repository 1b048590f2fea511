"""One step of the ring all-reduce, drawn as a ring: what each rank sends to its right
neighbour in that step and what every rank then holds (the states of
``collectives_figure.ring_all_reduce_states``, one slide per step)."""
from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, Rectangle

from reference_impl.comm.collectives_figure import ring_all_reduce_states


def plot_ring_step(n: int = 4, step: int = 0) -> Figure:
    """Step ``step`` of the 2(n-1) (0 = before the first): ranks on a circle, each with its n
    chunks (number of ranks summed in, Σ when complete), an arrow per send labelled by chunk."""
    states = ring_all_reduce_states(n)
    if not 0 <= step < len(states):
        raise ValueError(f"a ring all-reduce on {n} ranks has steps 0..{len(states) - 1}, got {step}")
    label, holding, received = states[step]
    figure = Figure(figsize=(9, 5.6), layout="constrained")
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
                                           color="#d62728", shrinkA=40, shrinkB=40))
            mx, my = (x + tx) / 2, (y + ty) / 2
            axes.text(mx * 1.45, my * 1.45, f"chunk {sent[right]}", ha="center", va="center",
                      fontsize=14, color="#d62728")
        axes.add_patch(Circle((x, y), 0.16, color="#4e79a7"))
        axes.text(x, y, str(rank), ha="center", va="center", fontsize=15, color="white")
        width = 0.34
        for chunk in range(n):
            members = holding[rank][chunk]
            full, new = len(members) == n, (rank, chunk) in received
            left = x - n * width / 2 + chunk * width
            top = y + (0.25 if y >= 0 else -0.25 - width)
            axes.add_patch(Rectangle((left, top), width * 0.92, width * 0.92,
                                     facecolor="#f28e2b" if full else "#c6dbef",
                                     edgecolor="#d62728" if new else "#555555",
                                     linewidth=2.5 if new else 0.8))
            axes.text(left + width * 0.46, top + width * 0.46, "Σ" if full else str(len(members)),
                      ha="center", va="center", fontsize=13)
    return figure
