"""Pictures of expert parallelism (lab 9): tokens travelling to their experts and back, the EP
and EDP groups on the rank grid, and the load per expert against the capacity.

* :func:`plot_token_exchange`: an EP group's ranks as columns, three rows: each rank's tokens
  (coloured by the rank that holds their expert), the rows each rank's experts compute after the
  dispatch (by source rank, within it by expert), and the tokens home again after the combine.
  The arrows of the dispatch and the combine are one all-to-all each, the second the reverse
  of the first.
* :func:`plot_expert_groups`: the ranks of one data-parallel group on a grid, EP groups as rows
  (ep consecutive ranks: every expert once) and EDP groups as columns (the same experts), as
  lab 1's figure draws groups: one colour per group.
* :func:`plot_expert_load`: tokens routed to each expert as bars, the capacity as a line, the
  assignments past it (dropped) in another colour.
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from reference_impl.figures.style import (GREY, HIGHLIGHT, NOTEBOOK_FONTSIZE, RANK_COLOURS,
                                          OPEN_SPINES, cycle_colour, hide_spines,
                                          legend_below, new_figure, swatch)
from reference_impl.comm.expert_groups import expert_parallel_groups
from reference_impl.moe.moe_costs import tokens_to_ranks


def _check_destinations(destinations: Sequence[Sequence[int]]) -> int:
    ep = len(destinations)
    if ep < 1 or any(not 0 <= d < ep for row in destinations for d in row):
        raise ValueError(f"every token's destination must be one of the {ep} ranks of the EP "
                         f"group, got {[list(row) for row in destinations]}")
    return ep


def exchange_rows(destinations: Sequence[Sequence[int]]) -> dict[str, list[list[tuple[int, int]]]]:
    """The rows of :func:`plot_token_exchange`, each row a list per rank of (source rank,
    token index) in the order the rank holds them: ``"tokens"`` (its own, in token order),
    ``"dispatched"`` (what its experts receive: by source rank, within it in token order),
    ``"combined"`` (its own again, back in token order)."""
    ep = _check_destinations(destinations)
    own = [[(rank, t) for t in range(len(row))] for rank, row in enumerate(destinations)]
    received = [[(s, t) for s in range(ep) for t, d in enumerate(destinations[s]) if d == rank]
                for rank in range(ep)]
    return {"tokens": own, "dispatched": received, "combined": own}


def plot_token_exchange(destinations: Sequence[Sequence[int]], fontsize: float = NOTEBOOK_FONTSIZE
                        ) -> Figure:
    """``destinations[r][t]``: the EP rank holding the expert of rank r's token t (k = 1).
    Tokens are boxes coloured by their destination; arrows show the dispatch (down) and the
    combine (down again, home)."""
    rows = exchange_rows(destinations)
    ep, tallest = len(destinations), max(max(len(r) for r in rows[k]) for k in rows)
    figure = new_figure(max(5.0, 1.9 * ep), 4.2)
    axes = figure.subplots()
    levels = {"tokens": 2.0, "dispatched": 1.0, "combined": 0.0}
    width = 0.8 / max(tallest, 1)
    place = {}
    for kind, level in levels.items():
        for rank, held in enumerate(rows[kind]):
            for position, (source, token) in enumerate(held):
                x = rank - 0.4 + position * width
                destination = destinations[source][token]
                axes.add_patch(FancyBboxPatch((x, level - 0.15), width * 0.9, 0.3,
                                              boxstyle="round,pad=0.01", label=kind,
                                              facecolor=RANK_COLOURS[destination % len(RANK_COLOURS)],
                                              edgecolor=RANK_COLOURS[source % len(RANK_COLOURS)],
                                              linewidth=1.5))
                axes.text(x + width * 0.45, level, f"{source}.{token}", ha="center",
                          va="center", fontsize=fontsize * 0.7, color="white")
                place[kind, source, token] = (x + width * 0.45, level)
    for (upper, lower), colour in ((("tokens", "dispatched"), HIGHLIGHT),
                                   (("dispatched", "combined"), GREY)):
        for source, row in enumerate(destinations):
            for token, destination in enumerate(row):
                if destination == source:
                    continue  # stays on the rank: no bytes leave it
                start, end = place[upper, source, token], place[lower, source, token]
                axes.add_patch(FancyArrowPatch((start[0], start[1] - 0.17), (end[0], end[1] + 0.17),
                                               arrowstyle="-|>", mutation_scale=7, color=colour,
                                               alpha=0.6, linewidth=0.8))
    axes.set_xlim(-0.5, ep - 0.5)
    axes.set_ylim(-0.4, 2.4)
    axes.set_xticks(range(ep), [f"EP rank {r}" for r in range(ep)], fontsize=fontsize)
    axes.set_yticks(list(levels.values()),
                    ["own tokens", "after the dispatch\n(at their experts)",
                     "after the combine\n(home, in order)"], fontsize=fontsize)
    axes.set_title("dispatch and combine: two all-to-alls, the second the reverse of the first "
                   "(fill: the expert's rank, edge: the token's)", fontsize=fontsize)
    axes.tick_params(length=0)
    hide_spines(axes)
    legend_below(figure, [swatch(HIGHLIGHT, "dispatch (all-to-all)"),
                          swatch(GREY, "combine (the reverse all-to-all)")], fontsize)
    return figure


def plot_expert_groups(dp: int, ep: int, num_experts: int,
                       fontsize: float = NOTEBOOK_FONTSIZE) -> Figure:
    """One data-parallel group of ``dp`` ranks: left, the EP groups (one colour each, a row
    per group); right, the EDP groups (one colour each, a column per group). Every box names
    the rank and the experts it holds."""
    if num_experts % ep:
        raise ValueError(f"{num_experts} experts are not divisible by ep = {ep}")
    groups = expert_parallel_groups([range(dp)], ep)
    per_rank = num_experts // ep
    figure = new_figure(max(5.0, 2.2 * ep), 0.9 * (dp // ep) + 1.6)
    for axes, kind, title in zip(figure.subplots(1, 2), ("EP", "EDP"),
                                 ("EP groups: ep consecutive ranks,\nevery expert once "
                                  "(tokens travel among them)",
                                  "EDP groups: the same experts,\none rank per EP group "
                                  "(expert gradients summed)")):
        colour_of = {rank: cycle_colour(index) for index, group in enumerate(groups[kind])
                     for rank in group}
        for rank in range(dp):
            row, column = divmod(rank, ep)
            first = column * per_rank
            axes.add_patch(FancyBboxPatch((column - 0.42, -row - 0.35), 0.84, 0.7,
                                          boxstyle="round,pad=0.02", facecolor=colour_of[rank],
                                          alpha=0.8, label=kind))
            axes.text(column, -row, f"GPU{rank}\nexperts {first}-{first + per_rank - 1}",
                      ha="center", va="center", fontsize=fontsize, color="white",
                      fontweight="bold")
        axes.set_xlim(-0.55, ep - 0.45)
        axes.set_ylim(-(dp // ep) + 0.45, 0.55)
        axes.set_xticks([])
        axes.set_yticks([])
        axes.set_title(f"{title}\n{len(groups[kind])} group(s) of {len(groups[kind][0])}",
                       fontsize=fontsize)
        hide_spines(axes)
    figure.suptitle(f"dp = {dp}, ep = {ep}, E = {num_experts}: {per_rank} experts per rank",
                    fontsize=fontsize + 1)
    return figure


def plot_expert_load(routed: Sequence[int], capacity: int | None = None,
                     title: str = "tokens per expert", ep: int | None = None,
                     fontsize: float = NOTEBOOK_FONTSIZE) -> Figure:
    """Bars of the assignments routed to each expert (before dropping); above ``capacity`` the
    part that is dropped; the mean as a dotted line; with ``ep``, the load of each EP rank
    (its experts' kept tokens) in the title."""
    figure = new_figure(max(4.0, 0.45 * len(routed) + 1.5), 2.8)
    axes = figure.subplots()
    limit = capacity if capacity is not None else max(routed, default=0)
    kept = [min(count, limit) for count in routed]
    dropped = [count - k for count, k in zip(routed, kept)]
    axes.bar(range(len(routed)), kept, color=RANK_COLOURS[0], label="kept")
    axes.bar(range(len(routed)), dropped, bottom=kept, color=HIGHLIGHT, label="dropped")
    mean = sum(routed) / max(len(routed), 1)
    axes.axhline(mean, color=GREY, linestyle=":", linewidth=1)
    handles = [swatch(RANK_COLOURS[0], "kept"), swatch(HIGHLIGHT, "dropped (past capacity)"),
               swatch(GREY, f"mean {mean:.3g}")]
    if capacity is not None:
        axes.axhline(capacity, color="black", linestyle="--", linewidth=1)
        handles.append(swatch("black", f"capacity {capacity}"))
    if ep is not None:
        title += f"; per EP rank: {tokens_to_ranks(kept, ep)}"
    axes.set_xticks(range(len(routed)), [str(e) for e in range(len(routed))], fontsize=fontsize)
    axes.set_xlabel("expert", fontsize=fontsize)
    axes.set_ylabel("assignments", fontsize=fontsize)
    axes.set_title(title, fontsize=fontsize)
    hide_spines(axes, OPEN_SPINES)
    legend_below(figure, handles, fontsize)
    return figure
