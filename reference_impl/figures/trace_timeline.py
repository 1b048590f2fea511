"""A profiler timeline as a figure: the merged trace of :mod:`reference_impl.perf.traces`,
one row per rank, compute and communication marked.

What Perfetto (https://ui.perfetto.dev) shows of ``merged.json``, reduced to :func:`profiled`'s
named ranges and drawn with matplotlib, so a slide or a notebook can show a real run's timeline
without a browser: module forward and backward ranges (compute) as blue boxes, collective and
send/receive ranges (communication) in orange on top of them, and the part of those spent in an
``isend``/``irecv`` ``wait()`` (a pipeline stage idle: the bubble) in red. Each row's label gives
the rank's communication share from :func:`summarize`, computed from the same ranges.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from reference_impl.figures.style import (BLUE, LIGHT_BLUE, ORANGE, RED, ROW_SPINES, SLIDE_FONTSIZE,
                                          hide_spines, legend_below, new_figure, swatch)
from reference_impl.perf.ranges import WAIT_SUFFIX, range_kind
from reference_impl.perf.trace_summary import summarize
from reference_impl.perf.traces import range_events

COLOURS = {"forward": BLUE, "backward": LIGHT_BLUE, "comm": ORANGE, "wait": RED}
LABELS = {"forward": "compute: forward", "backward": "compute: backward",
          "comm": "communication", "wait": "waiting for a message"}


def range_category(name: str) -> str:
    """"forward", "backward", "comm" or "wait": how :func:`plot_trace` colours a range."""
    kind = range_kind(name)
    if kind == "comm":
        return "wait" if name.endswith(WAIT_SUFFIX) else "comm"
    if kind == "compute":
        return "forward" if name.endswith(" forward") else "backward"
    raise ValueError(f"{name!r} is not a range of profiled(): a module's forward/backward or a "
                     f"collective, send or receive")


def plot_trace(trace, title: str | None = None, fontsize: float = SLIDE_FONTSIZE) -> Figure:
    """One row per rank (process) of ``trace`` (merged or one rank's: a path, dict or events),
    time in ms from the first range; compute below, communication and waits drawn over it."""
    events = range_events(trace)
    if not events:
        raise ValueError("the trace has no ranges of profiled(): profile inside "
                         "`with rank_trace(...), profiled(model):`")
    pids = sorted({event.get("pid", 0) for event in events}, key=str)
    table = summarize(trace)
    start = min(float(event["ts"]) for event in events)
    end = max(float(event["ts"]) + float(event.get("dur", 0)) for event in events)
    figure = new_figure(10, min(5.0, 1.6 + 1.0 * len(pids)))
    axes = figure.subplots()
    layer = {"forward": 1, "backward": 1, "comm": 2, "wait": 3}
    for event in events:
        category = range_category(event["name"])
        row = pids.index(event.get("pid", 0))
        x = (float(event["ts"]) - start) / 1e3
        width = float(event.get("dur", 0)) / 1e3
        height = 0.7 if layer[category] == 1 else 0.5
        axes.add_patch(Rectangle((x, row - height / 2), width, height, gid=category,
                                 facecolor=COLOURS[category], edgecolor="none",
                                 zorder=layer[category]))
    axes.set_xlim(0, (end - start) / 1e3)
    axes.set_ylim(len(pids) - 0.5, -0.5)
    labels = [f"rank {row.rank}\ncomm {row.comm_fraction:.0%}" for row in table]
    axes.set_yticks(range(len(pids)), labels[:len(pids)], fontsize=fontsize)
    axes.set_xlabel("time (ms)", fontsize=fontsize)
    axes.tick_params(axis="x", labelsize=fontsize - 1)
    axes.tick_params(axis="y", length=0)
    hide_spines(axes, ROW_SPINES)
    if title:
        axes.set_title(title, fontsize=fontsize + 1, loc="left")
    shown = sorted({range_category(event["name"]) for event in events}, key=list(COLOURS).index)
    legend_below(figure, [swatch(COLOURS[c], LABELS[c]) for c in shown], fontsize - 1)
    return figure
