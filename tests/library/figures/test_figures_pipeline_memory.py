"""Memory under the Gantt chart: held activations over time peak at the simulator's
peak_in_flight for every schedule; the filling pipeline draws only the passes begun."""
import pytest
from matplotlib.patches import Rectangle

from reference_impl.figures.pipeline_gantt import (in_flight_over_time, plot_gantt,
                                                    plot_gantt_with_memory)
from reference_impl.pipeline.interleaved import interleaved_one_f_one_b
from reference_impl.pipeline.pipeline_schedules import gpipe, one_f_one_b, zb_h1
from reference_impl.pipeline.pipeline_simulator import simulate


@pytest.mark.parametrize("schedule", [gpipe(4, 8), one_f_one_b(4, 8), zb_h1(4, 8),
                                      interleaved_one_f_one_b(4, 8, 2), one_f_one_b(3, 2)])
def test_memory_curve_peaks_where_the_simulator_says(schedule):
    timeline = simulate(schedule)
    for rank in range(schedule.ranks):
        steps = in_flight_over_time(timeline, rank)
        assert max(held for _, held in steps) == timeline.peak_in_flight[rank]
        assert steps[-1][1] == 0  # everything released by the end


def test_gantt_with_memory_has_a_curve_per_rank():
    timeline = simulate(gpipe(4, 8))
    gantt, memory = plot_gantt_with_memory(timeline).axes
    boxes = [p for p in gantt.patches if isinstance(p, Rectangle) and p.get_zorder() == 2]
    assert len(boxes) == len(timeline.events)
    assert [line.get_label() for line in memory.lines] == [f"rank {r}" for r in range(4)]
    assert max(max(line.get_ydata()) for line in memory.lines) == 8  # GPipe holds all m


def test_filling_pipeline_draws_what_has_started():
    timeline = simulate(gpipe(4, 4))
    (axes,) = plot_gantt(timeline, until=5).axes
    boxes = [p for p in axes.patches if isinstance(p, Rectangle) and p.get_zorder() == 2]
    assert len(boxes) == 4 + 4 + 3 + 2  # rank r has begun min(4, 5 - r) forwards
    assert max(box.get_x() + box.get_width() for box in boxes) == 5
    assert axes.get_xlim() == (0, timeline.makespan)
    assert "13 of 32 passes started" in axes.get_title(loc="left")
