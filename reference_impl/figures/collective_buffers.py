"""Each collective drawn as lectures draw it: what every rank holds before and after.

A rank's buffer is a row of n chunks; a chunk is coloured by the rank it came from, and
labelled with the ranks summed into it ("0+1+2+3", or Σ for all). The semantics are those of
``torch.distributed`` (and of the NCCL "Collective Operations" documentation, whose figures
these follow): ``plot_collective("all_reduce")`` etc., one figure per collective.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from reference_impl.figures.style import GREY_20, GREY_27, MATPLOTLIB_CYCLE, SUMMED, hide_spines, new_figure

# Each rank's buffer before and after, as lists of chunk contents: a chunk is a frozenset of
# the ranks whose data it holds (summed if more than one), None for an empty slot.
COLLECTIVES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def collective_states(name: str, n: int = 4, root: int = 0) -> tuple[list[list], list[list]]:
    """(before, after): ``before[r][c]`` / ``after[r][c]`` is chunk c of rank r's buffer."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}: one of {', '.join(COLLECTIVES)}")
    if n < 2:
        raise ValueError(f"a collective needs at least 2 ranks, got n={n}")
    everyone = frozenset(range(n))
    own = [[frozenset({r})] * n for r in range(n)]  # every rank: a full buffer of its own data
    if name == "broadcast":
        before = [own[root] if r == root else [None] * n for r in range(n)]
        return before, [own[root] for _ in range(n)]
    if name == "reduce":
        return own, [[everyone] * n if r == root else own[r] for r in range(n)]
    if name == "all_reduce":
        return own, [[everyone] * n for _ in range(n)]
    if name == "all_gather":
        before = [[frozenset({r}) if c == r else None for c in range(n)] for r in range(n)]
        return before, [[frozenset({c}) for c in range(n)] for _ in range(n)]
    if name == "reduce_scatter":
        return own, [[everyone if c == r else None for c in range(n)] for r in range(n)]
    # all_to_all: chunk c of rank r goes to rank c, into slot r
    before = [[frozenset({(r, c)}) for c in range(n)] for r in range(n)]
    return before, [[frozenset({(c, r)}) for c in range(n)] for r in range(n)]


def _label(chunk: frozenset, n: int) -> str:
    if chunk and isinstance(next(iter(chunk)), tuple):
        (source, slot), = chunk
        return f"{source}→{slot}"
    if len(chunk) == n and n > 2:
        return "Σ"
    return "+".join(str(r) for r in sorted(chunk))


def _origin_colour(rank: int) -> str:
    """The colour of rank ``rank``'s data: "C{rank}", the last one for every rank past ten."""
    return MATPLOTLIB_CYCLE[min(rank, len(MATPLOTLIB_CYCLE) - 1)]


def _draw_buffers(axes, buffers: list[list], n: int, title: str) -> None:
    for rank, row in enumerate(buffers):
        for column, chunk in enumerate(row):
            if chunk is None:
                face, text = "white", ""
            else:
                origin = next(iter(chunk))
                origin = origin[0] if isinstance(origin, tuple) else origin
                face = SUMMED if len(chunk) > 1 else _origin_colour(origin)
                text = _label(chunk, n)
            axes.add_patch(Rectangle((column, rank), 0.94, 0.86, facecolor=face,
                                     edgecolor=GREY_27, linewidth=1))
            axes.text(column + 0.47, rank + 0.43, text, ha="center", va="center",
                      fontsize=15, color="white", fontweight="bold")
    axes.set_xlim(-0.05, n)
    axes.set_ylim(n, -0.05)
    axes.set_yticks([r + 0.43 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=15)
    axes.set_xticks([])
    axes.tick_params(length=0)
    axes.set_title(title, fontsize=17)
    hide_spines(axes)


def plot_collective(name: str, n: int = 4, root: int = 0) -> Figure:
    """Before | arrow | after, for collective ``name`` on ``n`` ranks (one slide's figure)."""
    before, after = collective_states(name, n, root)
    figure = new_figure(11, 0.75 * n + 1.4)
    left, middle, right = figure.subplots(1, 3, width_ratios=[n, 1.1, n])
    _draw_buffers(left, before, n, "before")
    _draw_buffers(right, after, n, "after")
    middle.axis("off")
    middle.add_patch(FancyArrowPatch((0.05, 0.5), (0.95, 0.5), arrowstyle="-|>",
                                     mutation_scale=30, linewidth=3, color=GREY_20,
                                     transform=middle.transAxes))
    middle.text(0.5, 0.62, name, ha="center", va="bottom", fontsize=16, fontweight="bold",
                transform=middle.transAxes)
    return figure
