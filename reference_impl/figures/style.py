"""The one style of the course's figures: every colour they draw, and the conventions they share
(figure sizes in inches with constrained layout, font sizes for slides and notebooks, which
spines to hide, a legend of swatches under the panels).

The palette is Tableau 10, Tableau's default since version 10 (Maureen Stone, "How we designed
the new color palettes in Tableau 10"). Highlights, such as a message just received or an
all-reduce in the forward pass, use matplotlib's default colour cycle "C0".."C9": the
``tab10`` colormap, Tableau's earlier palette, whose values are written out here.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

# Tableau 10, in Tableau's order.
BLUE, ORANGE, RED, TEAL, GREEN = "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f"
YELLOW, PURPLE, PINK, BROWN, GREY = "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"
TABLEAU_10 = (BLUE, ORANGE, RED, TEAL, GREEN, YELLOW, PURPLE, PINK, BROWN, GREY)

# One colour per rank (tensor parallelism) and per pipeline stage (a layout on nodes).
RANK_COLOURS = (BLUE, ORANGE, GREEN, RED, PURPLE, TEAL, YELLOW, BROWN)
STAGE_COLOURS = (BLUE, ORANGE, TEAL, RED, GREEN, YELLOW, PURPLE, PINK)

# Lighter and darker shades of the palette: a pipeline's later model chunks (lighter), a
# backward pass, a chunk partly summed, a caption on green.
BLUE_SHADES = (BLUE, "#86b0d9", "#c0daf0")
ORANGE_SHADES = (ORANGE, "#f7b46e", "#fbd7ae")
GREEN_SHADES = (GREEN, "#8cc784", "#c4e4bf")
LIGHT_BLUE = "#a0cbe8"  # Tableau 20's light blue
PALE_BLUE = "#c6dbef"  # a light blue of the PARTIAL_SUMS colormap
DARK_GREEN = "#2d6a27"
PARTIAL_SUMS = "Blues"  # the colormap of a chunk summed over more and more ranks

# matplotlib's default colour cycle, "C0".."C9" (the tab10 colormap).
MATPLOTLIB_CYCLE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
HIGHLIGHT = MATPLOTLIB_CYCLE[3]  # just received; an all-reduce forward; across the network
GOOD = MATPLOTLIB_CYCLE[2]  # inside one node; a correct split
BACKWARD = MATPLOTLIB_CYCLE[0]  # an all-reduce in the backward pass
SUMMED = MATPLOTLIB_CYCLE[7]  # a chunk summed from several ranks

# Greys, named by their lightness in percent.
GREY_20, GREY_27, GREY_33 = "#333333", "#444444", "#555555"  # outlines, arrows, notes
GREY_47, GREY_50, GREY_53 = "#777777", "grey", "#888888"  # secondary lines and labels
GREY_90, GREY_95, GREY_96 = "#e6e6e6", "#f2f2f2", "#f5f5f5"  # idle time, node boxes
SLATE = "#9aa0a6"  # a tensor every rank holds whole

# Font sizes: a figure shown on a slide, and one shown in a notebook.
SLIDE_FONTSIZE = 12
NOTEBOOK_FONTSIZE = 8
GRID_ALPHA = 0.3

ALL_SPINES = ("top", "right", "bottom", "left")
OPEN_SPINES = ("top", "right")  # an x-y plot: its axes only
ROW_SPINES = ("top", "right", "left")  # one row per rank: the time axis only


def new_figure(width: float, height: float, constrained: bool = True) -> Figure:
    """A ``width`` x ``height`` inch figure (no pyplot), laid out by matplotlib's constrained
    layout unless the caller places its own axes."""
    return Figure(figsize=(width, height), layout="constrained" if constrained else None)


def cycle_colour(index: int) -> str:
    """Colour "C{index}" of matplotlib's default cycle, which repeats after ten."""
    return MATPLOTLIB_CYCLE[index % len(MATPLOTLIB_CYCLE)]


def hide_spines(axes, sides: tuple[str, ...] = ALL_SPINES) -> None:
    for side in sides:
        axes.spines[side].set_visible(False)


def swatch(colour: str, label: str, **options) -> Patch:
    """A legend entry: a patch of ``colour``."""
    return Patch(facecolor=colour, label=label, **options)


def legend_below(figure: Figure, handles: list, fontsize: float, ncol: int | None = None) -> None:
    """The legend in one row (or ``ncol`` columns) under the panels, without a frame."""
    figure.legend(handles=handles, loc="outside lower center", ncol=ncol or len(handles),
                  fontsize=fontsize, frameon=False)
