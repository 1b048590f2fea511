"""Scaling of TP, DP and PP as a figure: each method's strong and weak efficiency against the
number of ranks, and its measured all-reduce time beside the alpha-beta prediction (the rows of
:mod:`reference_impl.perf.scaling`).

    python -m reference_impl.figures.scaling --plot scaling.png

measures and prints the table as ``python -m reference_impl.perf.scaling`` does (same options)
and writes the plot.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from reference_impl.figures.style import GREY_50, GRID_ALPHA, new_figure
from reference_impl.perf.scaling import ScalingRow, measure_and_print, scaling_parser


def plot_scaling(rows: list[ScalingRow], title: str = "") -> Figure:
    """Each method's efficiency against N (strong and weak) and its measured vs predicted
    communication: a matplotlib Figure (no pyplot)."""
    figure = new_figure(10, 3.8)
    efficiency, comm = figure.subplots(1, 2)
    for method, marker in (("TP", "o"), ("DP", "s"), ("PP", "^")):
        mine = [r for r in rows if r.method == method]
        ns = [r.n for r in mine]
        efficiency.plot(ns, [r.strong_eff for r in mine], marker + "-", label=f"{method} strong")
        efficiency.plot(ns, [r.weak_eff for r in mine], marker + "--", label=f"{method} weak")
        predicted = [r for r in mine if r.predicted_s is not None]
        comm.plot([r.n for r in predicted], [1e3 * r.comm_s for r in predicted], marker + "-",
                  label=f"{method} measured")
        comm.plot([r.n for r in predicted], [1e3 * r.predicted_s for r in predicted],
                  marker + ":", label=f"{method} alpha-beta")
    efficiency.axhline(1.0, color=GREY_50, linestyle="--", linewidth=1)
    efficiency.set(xlabel="ranks N", ylabel="efficiency", title="scaling efficiency",
                   xticks=sorted({r.n for r in rows}), ylim=(0, None))
    comm.set(xlabel="ranks N", ylabel="all-reduce time per step (ms)",
             title="communication: measured vs predicted", xticks=sorted({r.n for r in rows}))
    for axes in (efficiency, comm):
        axes.grid(alpha=GRID_ALPHA)
        axes.legend(fontsize="small")
    if title:
        figure.suptitle(title)
    return figure


def main(argv: list[str] | None = None) -> None:
    parser = scaling_parser("python -m reference_impl.figures.scaling")
    parser.add_argument("--plot", metavar="FILE", required=True, help="write the plot to FILE (PNG)")
    args = parser.parse_args(argv)
    rows = measure_and_print(args)
    plot_scaling(rows, f"hidden {args.hidden}, seq {args.seq}, batch {args.batch}").savefig(
        args.plot, dpi=120)
    print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
