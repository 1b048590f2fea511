"""Gantt charts and Chrome traces of pipeline timelines: one row of boxes per rank, one box
and one trace event per pass, nothing negative."""
import json

import pytest
from matplotlib.patches import Rectangle

from reference_impl.figures.pipeline_gantt import chrome_trace, plot_gantt, save_chrome_trace
from reference_impl.pipeline.interleaved import interleaved_one_f_one_b
from reference_impl.pipeline.pipeline_schedules import Action, one_f_one_b, zb_h1
from reference_impl.pipeline.pipeline_simulator import TimedAction, Timeline, simulate


def pass_boxes(axes):
    """The boxes of passes (drawn above the grey idle background)."""
    return [patch for patch in axes.patches
            if isinstance(patch, Rectangle) and patch.get_zorder() == 2]


@pytest.mark.parametrize("schedule", [one_f_one_b(4, 8), zb_h1(3, 5),
                                      interleaved_one_f_one_b(2, 4, 2)])
def test_gantt_has_a_row_of_boxes_per_rank(schedule, tmp_path):
    timeline = simulate(schedule)
    figure = plot_gantt(timeline)
    (axes,) = figure.axes
    boxes = pass_boxes(axes)
    assert len(boxes) == len(timeline.events)
    rows = {round(box.get_y() + box.get_height() / 2) for box in boxes}
    assert rows == set(range(schedule.ranks))
    assert [label.get_text() for label in axes.get_yticklabels()] == [
        f"rank {rank}" for rank in range(schedule.ranks)]
    assert len(axes.texts) == len(timeline.events)  # the microbatch number in every box
    assert f"bubble {timeline.bubble_fraction:.1%}" in axes.get_title(loc="left")
    figure.savefig(tmp_path / "gantt.png", dpi=60)


def test_several_timelines_share_the_time_axis():
    timelines = [simulate(one_f_one_b(4, 8)), simulate(zb_h1(4, 8))]
    figure = plot_gantt(timelines, titles=["1F1B", "ZB-H1"])
    first, second = figure.axes[:2]
    assert first.get_xlim() == second.get_xlim() == (0, timelines[0].makespan)
    assert first.get_title(loc="left").startswith("1F1B\n")
    assert len(pass_boxes(second)) == 4 * 8 * 3


def test_gantt_refuses_mismatched_titles():
    with pytest.raises(ValueError, match="got 1 titles for 2 timelines"):
        plot_gantt([simulate(one_f_one_b(2, 2))] * 2, titles=["only one"])


def test_chrome_trace_has_one_event_per_pass(tmp_path):
    timeline = simulate(zb_h1(4, 6), comm=0.1)
    trace = chrome_trace(timeline)
    passes = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert len(passes) == 4 * 6 * 3
    assert all(event["dur"] >= 0 and event["ts"] >= 0 for event in passes)
    assert {event["pid"] for event in passes} == set(range(4))
    names = [event for event in trace["traceEvents"] if event["name"] == "process_name"]
    assert [event["args"]["name"] for event in names] == [f"rank {r}" for r in range(4)]
    last = max(event["ts"] + event["dur"] for event in passes)
    assert last == pytest.approx(timeline.makespan * 1000)  # a cost unit drawn as 1 ms
    path = save_chrome_trace(timeline, tmp_path / "trace.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))


def test_chrome_trace_of_a_measured_timeline_is_in_microseconds():
    schedule = one_f_one_b(1, 1)
    timeline = Timeline(schedule, (TimedAction(0, Action("F", 0, 0), 5.0, 5.002),
                                   TimedAction(0, Action("B", 0, 0), 5.002, 5.005)), unit="s")
    passes = [e for e in chrome_trace(timeline)["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], round(e["ts"], 6), round(e["dur"], 6)) for e in passes] == [
        ("F0", 0.0, 2000.0), ("B0", 2000.0, 3000.0)]
