"""A picture of ZeRO's partitions: what each data-parallel rank holds at stages 0 to 3.

One panel per stage, one bar per rank, stacked in bytes per parameter: the parameters, the
gradients and the optimizer states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", Figure 1 draws the same). A kind that the stage shards is
drawn 1/N as tall, at the height of the slice the rank owns (rank r: slice r), inside a
dotted outline of the whole it no longer holds. Each bar's height is
:func:`reference_impl.memory.model_states.zero_memory_formula` per parameter, which the panel's
title states.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from reference_impl.figures.style import (BLUE, GREEN, GREY_50, OPEN_SPINES, ORANGE, SLIDE_FONTSIZE,
                                          hide_spines, legend_below, new_figure, swatch)
from reference_impl.memory.model_states import BYTES_PER_PARAMETER, STAGES, zero_memory_formula

KINDS = ("parameters", "gradients", "optimizer")
# The kinds each stage shards (ZeRO section 5: P_os, P_os+g, P_os+g+p).
SHARDED = {0: (), 1: ("optimizer",), 2: ("gradients", "optimizer"), 3: KINDS}
_COLOURS = {"parameters": BLUE, "gradients": ORANGE, "optimizer": GREEN}
_STAGE_NAMES = {0: "DP (no sharding)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
_FORMULAS = {True: ("16", "4 + 12/N", "2 + 14/N", "16/N"),
             False: ("16", "8 + 8/N", "4 + 12/N", "16/N")}


def partition_bytes(world_size: int, stage: int, mixed_precision: bool = True) -> dict[str, float]:
    """Bytes per parameter one rank holds of each kind at ``stage`` on ``world_size`` ranks."""
    if stage not in (0, *STAGES):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    whole = dict(zip(KINDS, BYTES_PER_PARAMETER[bool(mixed_precision)]))
    return {kind: whole[kind] / world_size if kind in SHARDED[stage] else whole[kind]
            for kind in KINDS}


def plot_zero_partitions(world_size: int = 4, mixed_precision: bool = True,
                         fontsize: float = SLIDE_FONTSIZE) -> Figure:
    """Four panels (stages 0-3), one stacked bar per rank, heights in bytes per parameter."""
    figure = new_figure(10, 5)
    panels = figure.subplots(1, 4, sharey=True)
    precision = "mixed precision (2 + 2 + 12)" if mixed_precision else "fp32 (4 + 4 + 8)"
    figure.suptitle(f"Model-state bytes per parameter on each of N = {world_size} ranks, "
                    f"Adam, {precision}", fontsize=fontsize + 1)
    for stage, axes in enumerate(panels):
        held = partition_bytes(world_size, stage, mixed_precision)
        whole = partition_bytes(1, 0, mixed_precision)
        for rank in range(world_size):
            bottom = 0.0
            for kind in KINDS:
                sharded = kind in SHARDED[stage]
                # rank r owns slice r of a sharded kind: drawn at r/N of the whole it replaces
                y = bottom + rank * held[kind] if sharded else bottom
                if sharded:
                    axes.add_patch(Rectangle((rank - 0.4, bottom), 0.8, whole[kind],
                                             facecolor="none", edgecolor=_COLOURS[kind],
                                             linestyle=":", linewidth=1, zorder=1))
                axes.add_patch(Rectangle((rank - 0.4, y), 0.8, held[kind],
                                         facecolor=_COLOURS[kind], edgecolor="white",
                                         zorder=2, label=kind))
                bottom += whole[kind]
        per_parameter = zero_memory_formula(world_size, world_size, stage, mixed_precision)
        per_parameter /= world_size
        axes.set_title(f"{_STAGE_NAMES[stage]}\n{_FORMULAS[bool(mixed_precision)][stage]}"
                       f" = {per_parameter:.3g} B", fontsize=fontsize)
        axes.set_xlim(-0.6, world_size - 0.4)
        axes.set_ylim(0, 16.5)
        axes.set_xticks(range(world_size), [str(rank) for rank in range(world_size)],
                        fontsize=fontsize - 2)
        axes.set_xlabel("rank", fontsize=fontsize)
        axes.tick_params(axis="y", labelsize=fontsize - 2)
        hide_spines(axes, OPEN_SPINES)
    panels[0].set_ylabel("bytes per parameter", fontsize=fontsize)
    handles = [swatch(_COLOURS[kind], kind) for kind in KINDS]
    handles.append(swatch("none", "sharded: the rest is on other ranks", edgecolor=GREY_50,
                          linestyle=":"))
    legend_below(figure, handles, fontsize - 1)
    return figure
