"""Pictures of a pipeline timeline: a Gantt chart, and a trace for Perfetto / chrome://tracing.

:func:`plot_gantt` draws one row per rank and one box per pass, F, B and W in their own
colours with the microbatch number inside; the grey behind the boxes is the bubble, the time
a rank waits. Several timelines (1F1B next to ZB-H1, simulated next to measured) are stacked,
one panel each, on the same time axis when their units agree; ``until`` draws the pipeline as
it fills, up to a time. :func:`plot_gantt_with_memory` puts under the chart the activations
each rank holds over time (:func:`in_flight_over_time`).

:func:`chrome_trace` writes the same timeline in the Chrome trace-event format (one "process"
per rank, one complete "X" event per pass, times in microseconds), which
https://ui.perfetto.dev and chrome://tracing open; :func:`save_chrome_trace` saves it as JSON.
"""
from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from reference_impl.figures.style import (BLUE_SHADES, GREEN_SHADES, GREY_90, NOTEBOOK_FONTSIZE,
                                          OPEN_SPINES, ORANGE_SHADES, ROW_SPINES, SLIDE_FONTSIZE,
                                          cycle_colour, hide_spines, legend_below, new_figure,
                                          swatch)
from reference_impl.pipeline.pipeline_schedules import KIND_NAMES
from reference_impl.pipeline.pipeline_simulator import TimedAction, Timeline

# Per kind, one colour per model chunk, lighter for later chunks; more chunks reuse them.
_COLOURS = {"F": BLUE_SHADES, "B": ORANGE_SHADES, "W": GREEN_SHADES}
_IDLE = GREY_90


def _colour(event: TimedAction, ranks: int) -> str:
    palette = _COLOURS[event.action.kind]
    return palette[(event.action.stage // ranks) % len(palette)]


def _axis_label(unit: str) -> str:
    return "time (s)" if unit == "s" else "time (cost units)"


def plot_gantt(timeline_or_list: Timeline | list[Timeline],
               titles: list[str] | None = None, fontsize: float = NOTEBOOK_FONTSIZE,
               until: float | None = None) -> Figure:
    """One panel per timeline, one row per rank (rank 0 at the top), one box per pass.

    ``fontsize``: of the labels (8 for a notebook; about 13 for a slide). ``until``: draw only
    what has run by that time, on the whole time axis (the pipeline filling, step by step).
    """
    timelines = (list(timeline_or_list) if isinstance(timeline_or_list, (list, tuple))
                 else [timeline_or_list])
    if not timelines:
        raise ValueError("plot_gantt needs at least one timeline")
    if titles is not None and len(titles) != len(timelines):
        raise ValueError(f"got {len(titles)} titles for {len(timelines)} timelines")
    same_unit = len({timeline.unit for timeline in timelines}) == 1
    heights = [timeline.schedule.ranks + 1.2 for timeline in timelines]
    figure = new_figure(11, 0.42 * sum(heights) + 0.6)
    panels = figure.subplots(len(timelines), 1, sharex=same_unit, squeeze=False,
                             gridspec_kw={"height_ratios": heights})[:, 0]
    longest = max(timeline.makespan for timeline in timelines)
    for index, (axes, timeline) in enumerate(zip(panels, timelines)):
        title = titles[index] if titles is not None else None
        _draw(axes, timeline, title, fontsize, until)
        axes.set_xlim(0, longest if same_unit else timeline.makespan)
        if index == len(timelines) - 1 or not same_unit:
            axes.set_xlabel(_axis_label(timeline.unit), fontsize=fontsize)
    kinds = sorted({event.action.kind for timeline in timelines for event in timeline.events},
                   key="FBW".index)
    handles = [swatch(_COLOURS[kind][0], f"{kind}: {KIND_NAMES[kind]}") for kind in kinds]
    handles.append(swatch(_IDLE, "idle (bubble)"))
    legend_below(figure, handles, fontsize)
    return figure


def _draw(axes, timeline: Timeline, title: str | None, fontsize: float = NOTEBOOK_FONTSIZE,
          until: float | None = None) -> None:
    schedule = timeline.schedule
    p, start, makespan = schedule.ranks, timeline.start, timeline.makespan
    shortest = min((e.end - e.start for e in timeline.events if e.end > e.start), default=1.0)
    # Two digits at size f take about f points; a box is shortest/makespan of ~10 inches
    # (720 points) wide: shrink the text to fit the narrowest box, within 4..fontsize points.
    box_fontsize = max(4.0, min(fontsize, 720 * shortest / makespan))
    shown = makespan if until is None else max(0.0, min(until, makespan))
    for rank in range(p):
        axes.add_patch(Rectangle((0, rank - 0.4), shown, 0.8, facecolor=_IDLE,
                                 edgecolor="none", zorder=1))
    for event in timeline.events:
        if until is not None and event.start - start >= until:
            continue
        x = event.start - start
        width = event.end - event.start if until is None else min(event.end - start, until) - x
        axes.add_patch(Rectangle((x, event.rank - 0.4), width, 0.8,
                                 facecolor=_colour(event, p), edgecolor="white",
                                 linewidth=0.6, zorder=2))
        axes.text(x + width / 2, event.rank, str(event.action.microbatch), ha="center",
                  va="center", fontsize=box_fontsize, zorder=3,
                  color="white" if event.action.stage % (3 * p) < p else "black")
    axes.set_ylim(p - 0.5, -0.5)
    axes.set_yticks(range(p), [f"rank {rank}" for rank in range(p)], fontsize=fontsize)
    axes.tick_params(axis="x", labelsize=fontsize)
    axes.tick_params(axis="y", length=0)
    hide_spines(axes, ROW_SPINES)
    summary = f"{schedule.name}: p={p}, m={schedule.microbatches}"
    if schedule.chunks > 1:
        summary += f", v={schedule.chunks} (lighter: later chunks)"
    if until is None:
        summary += (f"; makespan {makespan:.4g} {'s' if timeline.unit == 's' else 'units'}, "
                    f"bubble {timeline.bubble_fraction:.1%}")
    else:
        started = sum(event.start - start < until for event in timeline.events)
        summary += f"; at t = {until:g}: {started} of {len(timeline.events)} passes started"
        axes.axvline(shown, color="black", linewidth=1, zorder=4)
    axes.set_title(f"{title}\n{summary}" if title else summary, fontsize=fontsize + 1,
                   loc="left")


def in_flight_over_time(timeline: Timeline, rank: int) -> list[tuple[float, int]]:
    """``rank``'s held activations as steps ``(time, count)`` from time 0: one more when a
    forward starts, one fewer when its last use ends (the B, or the W when the backward is
    split), as :attr:`Timeline.peak_in_flight` counts them; its maximum is that peak."""
    release = "W" if timeline.schedule.split_backward else "B"
    changes = sorted([(event.start - timeline.start, 1) for event in timeline.on_rank(rank)
                      if event.action.kind == "F"]
                     + [(event.end - timeline.start, -1) for event in timeline.on_rank(rank)
                        if event.action.kind == release])
    steps, held = [(0.0, 0)], 0
    for time, change in changes:  # a release and a forward at the same time: one net step
        held += change
        if steps[-1][0] == time:
            steps[-1] = (time, held)
        else:
            steps.append((time, held))
    return steps


def plot_gantt_with_memory(timeline: Timeline, title: str | None = None,
                           fontsize: float = SLIDE_FONTSIZE) -> Figure:
    """The Gantt chart, and under it on the same time axis the activations each rank holds
    (in microbatches; in chunks with v > 1): GPipe's climb to m, 1F1B's plateau at p - r."""
    p = timeline.schedule.ranks
    figure = new_figure(10, 5)
    gantt, memory = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1]})
    _draw(gantt, timeline, title, fontsize)
    gantt.set_xlim(0, timeline.makespan)
    for rank in range(p):
        times, held = zip(*in_flight_over_time(timeline, rank))
        memory.step([*times, timeline.makespan], [*held, held[-1]], where="post",
                    color=cycle_colour(rank), linewidth=2, label=f"rank {rank}")
    unit = "chunks" if timeline.schedule.chunks > 1 else "microbatches"
    memory.set_ylabel(f"activations held\n({unit})", fontsize=fontsize)
    memory.set_xlabel(_axis_label(timeline.unit), fontsize=fontsize)
    memory.set_ylim(0, 1.4 * max(timeline.peak_in_flight) + 0.5)  # room for the legend
    memory.tick_params(labelsize=fontsize)
    memory.legend(fontsize=fontsize - 1, ncol=p, loc="upper right", frameon=False)
    hide_spines(memory, OPEN_SPINES)
    return figure


def chrome_trace(timeline: Timeline, us_per_unit: float | None = None) -> dict:
    """The timeline as Chrome trace-event JSON: process ``rank r`` per rank, an "X" per pass.

    Times are in microseconds: seconds times 1e6 for a measured timeline, and one simulated
    cost unit is drawn as ``us_per_unit`` microseconds (default 1000, one millisecond).
    """
    if us_per_unit is None:
        us_per_unit = 1e6 if timeline.unit == "s" else 1000.0
    schedule = timeline.schedule
    events: list[dict] = []
    for rank in range(schedule.ranks):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    for event in timeline.events:
        action = event.action
        name = f"{action.kind}{action.microbatch}"
        if schedule.chunks > 1:
            name += f" (stage {action.stage})"
        events.append({
            "name": name, "cat": KIND_NAMES[action.kind], "ph": "X",
            "pid": event.rank, "tid": 0,
            "ts": (event.start - timeline.start) * us_per_unit,
            "dur": (event.end - event.start) * us_per_unit,
            "args": {"microbatch": action.microbatch, "stage": action.stage,
                     "kind": action.kind},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": schedule.name, "ranks": schedule.ranks,
                          "microbatches": schedule.microbatches, "chunks": schedule.chunks}}


def save_chrome_trace(timeline: Timeline, path: str | Path,
                      us_per_unit: float | None = None) -> Path:
    """Write :func:`chrome_trace` to ``path`` (open it in https://ui.perfetto.dev)."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(timeline, us_per_unit)))
    return path
