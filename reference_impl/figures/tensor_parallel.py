"""Pictures of tensor parallelism for labs 2 and 3, one idea each; each returns a matplotlib
``Figure``, the matrices drawn as a linear layer computes them, y = x Wᵀ, a colour per rank.

* :func:`plot_linear_split`: a weight split column- or row-parallel (Megatron-LM, as in the
  course notes "Week 15 - Tensor Parallelism and Pipeline Parallelism");
* :func:`plot_distributed_linear`: SageMaker's distributed linear ("How Tensor Parallelism Works");
* :func:`plot_qkv_split`: why the fused [q; k; v] weight must be split block by block;
* :func:`plot_block_collectives`: where the f and g operators sit in a TP block.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from reference_impl.figures.style import (BACKWARD, GOOD, GREY_20, GREY_27, GREY_33, GREY_47,
                                          GREY_53, HIGHLIGHT, RANK_COLOURS, SLATE, new_figure)
from reference_impl.tp.tp_splits import check_head_split

_WHOLE = SLATE  # a tensor every rank holds whole
_FORWARD = HIGHLIGHT  # an all-reduce in the forward pass


def rank_colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def _frame(axes, x, y, width, height):
    """The outline of a whole matrix whose top-left corner is (x, y) (y grows downwards)."""
    axes.add_patch(Rectangle((x, y), width, height, facecolor="white", edgecolor=GREY_33,
                             linewidth=1.0, zorder=1))


def _fill(axes, x, y, width, height, colour, hatch=None, alpha=0.9):
    axes.add_patch(Rectangle((x, y), width, height, facecolor=colour, edgecolor=GREY_20,
                             linewidth=0.8, hatch=hatch, alpha=alpha, zorder=2))


def _label(axes, x, y, text, size=10, **options):
    options = {"ha": "center", "va": "center", **options}
    axes.text(x, y, text, fontsize=size, zorder=4, **options)


def _blank_axes(figure, width, height):
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(0, width)
    axes.set_ylim(height, 0)
    axes.set_aspect("equal")
    axes.axis("off")
    return axes


def plot_linear_split(kind: str = "column", tp: int = 2) -> Figure:
    """What rank r holds and computes in a column- or row-parallel y = x Wᵀ + b, one row per
    rank, and the collective that completes the output."""
    if kind not in ("column", "row"):
        raise ValueError(f"kind must be 'column' or 'row', got {kind!r}")
    if not 1 <= tp <= len(RANK_COLOURS):
        raise ValueError(f"tp must be between 1 and {len(RANK_COLOURS)}, got {tp}")
    tokens, inner, out = 1.0, 1.6, 2.0  # drawn sizes of the three dimensions
    row_height, top = inner + 0.7, 0.9
    x_at, w_at, y_at = 1.3, 3.5, 6.2  # left edges of x, Wᵀ and y
    width, height = 11.6, top + row_height * tp + tokens + 0.3
    figure = new_figure(width * 0.8, height * 0.8, constrained=False)
    axes = _blank_axes(figure, width, height)
    if kind == "column":
        title = (f"Column-parallel linear, tp = {tp}: W split by output features "
                 "(the columns of Wᵀ)")
    else:
        title = (f"Row-parallel linear, tp = {tp}: W split by input features "
                 "(the rows of Wᵀ)")
    _label(axes, width / 2, 0.3, title, size=12, fontweight="bold")
    for rank in range(tp):
        top_of_row = top + rank * row_height
        middle = top_of_row + inner / 2
        colour = rank_colour(rank)
        _label(axes, 0.55, middle, f"rank {rank}", size=10, fontweight="bold", color=colour)
        xy = top_of_row + (inner - tokens) / 2  # x and y are centred on Wᵀ
        # x
        _frame(axes, x_at, xy, inner, tokens)
        if kind == "column":
            _fill(axes, x_at, xy, inner, tokens, _WHOLE)
            x_text = "x (whole)"
        else:
            _fill(axes, x_at + rank * inner / tp, xy, inner / tp, tokens, colour)
            x_text = f"x_{rank}: my in/{tp}" if tp > 1 else "x"
        _label(axes, x_at + inner / 2, xy - 0.2, x_text, size=9)
        _label(axes, (x_at + inner + w_at) / 2, middle, "×", size=14)
        # Wᵀ
        _frame(axes, w_at, top_of_row, out, inner)
        if kind == "column":
            _fill(axes, w_at + rank * out / tp, top_of_row, out / tp, inner, colour)
            w_text = f"W_{rank}ᵀ: in × out/{tp}"
        else:
            _fill(axes, w_at, top_of_row + rank * inner / tp, out, inner / tp, colour)
            w_text = f"W_{rank}ᵀ: in/{tp} × out"
        _label(axes, w_at + out / 2, top_of_row - 0.2, w_text, size=9)
        _label(axes, (w_at + out + y_at) / 2, middle, "=", size=14)
        # y
        _frame(axes, y_at, xy, out, tokens)
        if kind == "column":
            _fill(axes, y_at + rank * out / tp, xy, out / tp, tokens, colour)
            y_text, note = f"y_{rank}: my out/{tp}", "complete values,\nno communication"
        else:
            _fill(axes, y_at, xy, out, tokens, colour, hatch="//", alpha=0.45)
            y_text, note = f"partial y_{rank}", "a partial sum\nof every output"
        _label(axes, y_at + out / 2, xy - 0.2, y_text, size=9)
        _label(axes, y_at + out + 0.3, middle, note, size=9, ha="left", color=GREY_20)
    # the collective that completes y
    xy = top + tp * row_height
    _frame(axes, y_at, xy, out, tokens)
    if kind == "column":
        for rank in range(tp):
            _fill(axes, y_at + rank * out / tp, xy, out / tp, tokens, rank_colour(rank))
        left = "if the next layer needs all of y: all-gather along the last dim"
        right = "y = [y_0 | y_1 | …]"
    else:
        _fill(axes, y_at, xy, out, tokens, GREY_33, alpha=0.8)
        left = "all-reduce (sum) over the TP group, then + b once"
        right = "y = Σ_r x_r W_rᵀ + b"
    _label(axes, y_at - 0.3, xy + tokens / 2, left, size=10, ha="right", color=_FORWARD)
    _label(axes, y_at + out + 0.3, xy + tokens / 2, right, size=10, ha="left")
    return figure


def plot_distributed_linear(tp: int = 2) -> Figure:
    """SageMaker's distributed linear ("How Tensor Parallelism Works"), one row per rank: my
    samples, all-gathered; my input columns of them times my shard of Wᵀ; the partial outputs
    reduce-scattered."""
    if not 2 <= tp <= 4:
        raise ValueError(f"draw with tp between 2 and 4, got {tp}")
    sample, inner, out = 0.5, 1.6, 1.6  # drawn rows per rank's samples, in, out
    gathered = sample * tp
    row_height, top = max(gathered, inner) + 0.9, 1.0
    at = {"x": 1.2, "X": 4.2, "W": 6.6, "P": 9.0, "y": 12.2}
    width, height = 14.2, top + row_height * tp
    figure = new_figure(width * 0.75, height * 0.75, constrained=False)
    axes = _blank_axes(figure, width, height)
    _label(axes, width / 2, 0.25, f"SageMaker's distributed linear, tp = {tp}: "
           "every rank brings its own samples", size=12, fontweight="bold")
    _label(axes, width / 2, 0.62, "W split by input features; the partial outputs are "
           "reduce-scattered (sum) back to the samples' owners", size=10)
    for rank in range(tp):
        top_of_row = top + rank * row_height + 0.3
        middle = top_of_row + max(gathered, inner) / 2
        colour = rank_colour(rank)
        _label(axes, 0.5, middle, f"rank {rank}", size=10, fontweight="bold", color=colour)
        stack = middle - gathered / 2  # top of the gathered samples, centred on the row
        mine = stack + rank * sample
        # x_r: my samples
        _frame(axes, at["x"], mine, inner, sample)
        _fill(axes, at["x"], mine, inner, sample, colour)
        _label(axes, at["x"] + inner / 2, mine - 0.2, f"my samples x_{rank}", size=9)
        _arrow(axes, at["x"] + inner + 0.1, middle, at["X"] - 0.1, middle, "all-gather",
               _FORWARD)
        # X: every rank's samples; my input columns of them in full colour
        _frame(axes, at["X"], stack, inner, gathered)
        for owner in range(tp):
            _fill(axes, at["X"], stack + owner * sample, inner, sample, rank_colour(owner),
                  alpha=0.25)
            _fill(axes, at["X"] + rank * inner / tp, stack + owner * sample, inner / tp,
                  sample, rank_colour(owner))
        _label(axes, at["X"] + inner / 2, stack - 0.2, "all samples, my in/" + str(tp),
               size=9)
        _label(axes, (at["X"] + inner + at["W"]) / 2, middle, "×", size=14)
        # my shard of Wᵀ: rows = my input features
        w_top = middle - inner / 2
        _frame(axes, at["W"], w_top, out, inner)
        _fill(axes, at["W"], w_top + rank * inner / tp, out, inner / tp, _WHOLE)
        _label(axes, at["W"] + out / 2, w_top - 0.2, f"W_{rank}ᵀ: in/{tp} × out", size=9)
        _label(axes, (at["W"] + out + at["P"]) / 2, middle, "=", size=14)
        # partial outputs for every sample
        _frame(axes, at["P"], stack, out, gathered)
        for owner in range(tp):
            _fill(axes, at["P"], stack + owner * sample, out, sample, rank_colour(owner),
                  hatch="//", alpha=0.45)
        _label(axes, at["P"] + out / 2, stack - 0.2, "partial, all samples", size=9)
        _arrow(axes, at["P"] + out + 0.1, middle, at["y"] - 0.1, middle,
               "reduce-scatter\n(sum)", _FORWARD)
        # y_r: complete outputs of my samples
        _frame(axes, at["y"], mine, out, sample)
        _fill(axes, at["y"], mine, out, sample, colour)
        _label(axes, at["y"] + out / 2, mine - 0.2, f"y_{rank} = x_{rank} Wᵀ", size=9)
    return figure


def _arrow(axes, x0, y0, x1, y1, text, colour):
    axes.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=14,
                                   color=colour, linewidth=1.5, zorder=3))
    _label(axes, (x0 + x1) / 2, y0 - 0.12, text, size=9, color=colour, va="bottom")


def qkv_owner(row_block: int, heads: int, tp: int, blocks: int) -> int:
    """Which rank gets head-block ``row_block`` (0 .. 3*heads-1, [q; k; v] order) of the fused
    qkv weight when each of its ``blocks`` blocks is split into tp contiguous pieces."""
    per_block = 3 * heads // blocks
    return (row_block % per_block) * tp // per_block


def plot_qkv_split(heads: int = 4, tp: int = 2) -> Figure:
    """The fused qkv weight's rows, one cell per head's q, k or v rows, coloured by the rank
    that gets them: split naively into tp chunks (top) and block by block (bottom)."""
    check_head_split(heads, tp)
    cell, left = 0.8, 2.6
    width = left + 3 * heads * cell + 0.3
    figure = new_figure(width * 0.85, 4.2 * 0.85, constrained=False)
    axes = _blank_axes(figure, width, 4.2)
    _label(axes, width / 2, 0.3, f"Fused qkv weight ([q; k; v] rows, {heads} heads), "
           f"split over tp = {tp}: colour = the rank that gets those rows", size=12,
           fontweight="bold")
    schemes = [(1, "naive: chunk(tp)", "rank 0 gets all of q and half of k: its heads have no v"),
               (3, "blocks=3: chunk q, k, v\neach in tp", "each rank gets q, k and v of "
                f"the same {heads // tp} heads")]
    for line, (blocks, name, verdict) in enumerate(schemes):
        y = 0.9 + line * 1.65
        _label(axes, left - 0.15, y + cell / 2, name, size=10, ha="right")
        for index in range(3 * heads):
            part, head = "qkv"[index // heads], index % heads
            owner = qkv_owner(index, heads, tp, blocks)
            _fill(axes, left + index * cell, y, cell, cell, rank_colour(owner))
            _label(axes, left + (index + 0.5) * cell, y + cell / 2, f"{part}{head}", size=10,
                   color="white", fontweight="bold")
        mark, colour = ("✗", _FORWARD) if blocks == 1 else ("✓", GOOD)
        _label(axes, left, y + cell + 0.3, f"{mark} {verdict}", size=10, ha="left",
               color=colour)
    return figure


def plot_block_collectives() -> Figure:
    """One tensor-parallel transformer block, its attention and its MLP sublayer one above the
    other: which parts are split over the TP group, and where the f and g operators, and so
    the all-reduces, are."""
    rows = [  # (label, kind): "whole" (every rank), "split" (my shard), "f", "g", "+", "tensor"
        [("x", "tensor"), ("LN1", "whole"), ("f", "f"), ("QKV\ncolumn", "split"),
         ("my\nheads", "split"), ("proj\nrow", "split"), ("g", "g"), ("+", "+"),
         ("x₁", "tensor")],
        [("x₁", "tensor"), ("LN2", "whole"), ("f", "f"), ("fc1\ncolumn", "split"),
         ("GeLU", "split"), ("fc2\nrow", "split"), ("g", "g"), ("+", "+"), ("out", "tensor")]]
    regions = ["attention: heads split over the tp ranks", "MLP: 4h features split over the tp ranks"]
    box, gap = 0.95, 0.35
    width = 0.3 + len(rows[0]) * (box + gap)
    row_height, first_axis = 3.0, 2.0
    height = first_axis + row_height * len(rows) - 0.6
    figure = new_figure(width * 0.8, height * 0.8, constrained=False)
    axes = _blank_axes(figure, width, height)
    _label(axes, width / 2, 0.3, "A tensor-parallel block: 2 all-reduces forward (g), "
           "2 backward (f), each of the activation b·s·h", size=12, fontweight="bold")
    for number, (steps, region) in enumerate(zip(rows, regions)):
        axis_y = first_axis + number * row_height
        centre = [0.3 + index * (box + gap) + box / 2 for index in range(len(steps))]
        for index, (text, kind) in enumerate(steps):
            _block_step(axes, centre[index], axis_y, text, kind, box)
            if index:
                start = centre[index - 1] + (0.42 if steps[index - 1][1] != "tensor" else 0.25)
                axes.add_patch(FancyArrowPatch((start, axis_y), (centre[index] - 0.42, axis_y),
                                               arrowstyle="-|>", mutation_scale=10,
                                               color=GREY_20, zorder=1))
        # the residual connection, over the top
        over, xs, xe = axis_y - 1.0, centre[0], centre[7]
        axes.plot([xs, xs, xe], [axis_y - 0.25, over, over], color=GREY_53, linewidth=1,
                  zorder=1)
        axes.add_patch(FancyArrowPatch((xe, over), (xe, axis_y - 0.25), arrowstyle="-|>",
                                       mutation_scale=10, color=GREY_53, zorder=1))
        _label(axes, (xs + xe) / 2, over - 0.15, "residual", size=9, color=GREY_47)
        # the split region
        x0, x1 = centre[3] - box / 2 - 0.1, centre[5] + box / 2 + 0.1
        axes.add_patch(Rectangle((x0, axis_y - 0.6), x1 - x0, 1.2, facecolor=rank_colour(0),
                                 alpha=0.08, edgecolor=rank_colour(0), linestyle="--",
                                 zorder=0))
        _label(axes, (x0 + x1) / 2, axis_y + 0.85, region, size=10, color=rank_colour(0))
    _label(axes, width / 2, height - 0.55, "grey: whole on every rank    blue: this rank's "
           "shard only    f, g: Megatron's conjugate operators", size=10, color=GREY_27)
    _label(axes, width / 2, height - 0.2, "g forward: sum the row-parallel partial outputs    "
           "f backward: sum the parts of the input gradient", size=10, color=GREY_27)
    return figure


def _block_step(axes, x, axis_y, text, kind, box):
    if kind in ("f", "g"):
        axes.add_patch(FancyBboxPatch((x - 0.32, axis_y - 0.32), 0.64, 0.64,
                                      boxstyle="circle,pad=0.02", facecolor="white",
                                      edgecolor=GREY_20, linewidth=1.6, zorder=3))
        _label(axes, x, axis_y, text, size=14, fontweight="bold", fontstyle="italic")
        forward, backward = ("identity", "all-reduce") if kind == "f" else ("all-reduce", "identity")
        _label(axes, x, axis_y + 0.62, f"fwd: {forward}", size=9,
               color=_FORWARD if forward == "all-reduce" else GREY_33)
        _label(axes, x, axis_y + 0.92, f"bwd: {backward}", size=9,
               color=BACKWARD if backward == "all-reduce" else GREY_33)
    elif kind == "+":
        _label(axes, x, axis_y, "⊕", size=20)
    elif kind == "tensor":
        _label(axes, x, axis_y, text, size=12, fontweight="bold")
    else:
        split = kind == "split"
        axes.add_patch(FancyBboxPatch((x - box / 2, axis_y - 0.42), box, 0.84,
                                      boxstyle="round,pad=0.03",
                                      facecolor=rank_colour(0) if split else _WHOLE,
                                      alpha=0.85 if split else 0.6, edgecolor=GREY_20,
                                      zorder=2))
        _label(axes, x, axis_y, text, size=10, color="white" if split else "black")
