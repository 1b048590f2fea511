"""A picture of a rank layout: one panel per kind of group, each group in its own colour.

Ranks are placed on a grid: pipeline stage (pp) left to right, and top to bottom the model
replicas (rdp), each a band of its tp ranks. Within a panel, ranks of the same colour form one
group of that kind; the figure of the SageMaker model parallelism documentation's "Ranking
Mechanism" page draws the same groups with boundary lines.

    python -m reference_impl.figures.rank_groups --world-size 8 --tp 2 --pp 2 --plot groups.png

prints the layout as ``python -m reference_impl.comm.groups`` does (same arguments) and saves
its figure.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from reference_impl.comm.groups import RankLayout, layout_parser, parsed_layout
from reference_impl.figures.style import ROW_SPINES, cycle_colour, hide_spines, new_figure

_KIND_TITLES = {
    "TP": "TP_GROUP: shards of one layer",
    "PP": "PP_GROUP: stages of one pipeline",
    "DP": "DP_GROUP: same stage (RDP x TP)",
    "RDP": "RDP_GROUP: same shard, other replicas",
    "MP": "MP_GROUP: one whole model (TP x PP)",
    "WORLD": "WORLD",
}


def plot_rank_groups(layout: RankLayout) -> Figure:
    """Return a figure with one panel per group kind (TP, PP, DP, RDP, MP, WORLD)."""
    rows, cols = layout.rdp * layout.tp, layout.pp
    cell = 0.9
    figure = new_figure(3 * max(2.2, 1.1 * cols * cell + 0.8), 2 * (0.45 * rows + 1.2))
    figure.suptitle(f"{layout.world_size} ranks: tp={layout.tp}, pp={layout.pp}, "
                    f"rdp={layout.rdp} (dp={layout.dp}), order {'-'.join(layout.order)}")
    for axes, (kind, groups) in zip(figure.subplots(2, 3).flat, layout.groups.items()):
        colour_of = {rank: cycle_colour(index) for index, group in enumerate(groups)
                     for rank in group}
        for coords in layout.ranks:
            x = coords.pp_rank
            y = _row(layout, coords.rdp_rank, coords.tp_rank)
            axes.add_patch(FancyBboxPatch((x - cell / 2, -y - 0.4), cell, 0.8,
                                          boxstyle="round,pad=0.02",
                                          facecolor=colour_of[coords.rank], alpha=0.75))
            axes.text(x, -y, f"GPU{coords.rank}", ha="center", va="center", fontsize=8,
                      color="white", fontweight="bold")
        axes.set_xlim(-0.6, cols - 0.4)
        axes.set_ylim(-(rows + 0.25 * layout.rdp) + 0.3, 0.6)
        axes.set_xticks(range(cols), [f"stage {p}" for p in range(cols)], fontsize=7)
        rows_of = [(r, t) for r in range(layout.rdp) for t in range(layout.tp)]
        axes.set_yticks([-_row(layout, r, t) for r, t in rows_of],
                        [f"rdp {r}, tp {t}" for r, t in rows_of], fontsize=7)
        axes.set_title(f"{_KIND_TITLES[kind]}\n{len(groups)} group(s) of {len(groups[0])}",
                       fontsize=8)
        axes.tick_params(length=0)
        hide_spines(axes, ROW_SPINES)
    return figure


def _row(layout: RankLayout, rdp_rank: int, tp_rank: int) -> float:
    """Vertical position of a rank: replicas top to bottom, a small gap between them."""
    return rdp_rank * layout.tp + tp_rank + 0.25 * rdp_rank


def main(argv: list[str] | None = None) -> None:
    parser = layout_parser("python -m reference_impl.figures.rank_groups",
                           "Print every rank's coordinates and groups, and save a figure of "
                           "the groups.")
    parser.add_argument("--plot", metavar="FILE", required=True, help="where the figure goes")
    args = parser.parse_args(argv)
    if args.cp > 1:
        parser.error(f"the figure draws tp x pp x rdp layouts; --cp {args.cp} has no figure")
    layout = parsed_layout(parser, args)
    print(layout.describe())
    plot_rank_groups(layout).savefig(args.plot, dpi=120, bbox_inches="tight")
    print(f"\nfigure saved to {args.plot}")


if __name__ == "__main__":
    main()
