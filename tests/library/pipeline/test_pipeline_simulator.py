"""The pipeline simulator agrees with the closed forms: bubble (p-1)/(m+p-1) for GPipe and
1F1B, makespan (m + (p-1)/v)(T_F + T_B) for interleaved, (p-1)(T_F + T_B - T_W) for ZB-H1;
and with the activation memory each schedule is known to hold."""
import pytest

from reference_impl.pipeline.interleaved import interleaved_one_f_one_b
from reference_impl.pipeline.named_schedules import build_schedule
from reference_impl.pipeline.pipeline_schedules import (
    Action, gpipe, naive, one_f_one_b, schedule_from_strings, zb_h1)
from reference_impl.pipeline.pipeline_simulator import (
    TimedAction, Timeline, bubble_formula, makespan_formula, simulate)
from reference_impl.pipeline.pipeline_validator import ScheduleError

SIZES = [(p, m) for p in range(1, 6) for m in range(1, 10)]
COSTS = [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0), (0.3, 0.7)]  # (T_F, T_B + T_W)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name):
    for p, m in SIZES:
        for cost_f, cost_b in COSTS:
            timeline = simulate(build_schedule(name, p, m), cost_f, cost_b)
            assert timeline.makespan == pytest.approx((m + p - 1) * (cost_f + cost_b))
            assert timeline.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
            assert bubble_formula(name, p, m, cost_f=cost_f, cost_b=cost_b) == pytest.approx(
                (p - 1) / (m + p - 1))


def test_naive_pipeline_has_one_rank_busy_at_a_time():
    for p in range(1, 6):
        timeline = simulate(naive(p))
        assert timeline.bubble_fraction == pytest.approx((p - 1) / p)
        assert bubble_formula("naive", p, 1) == pytest.approx((p - 1) / p)


def test_interleaved_makespan_is_m_plus_p_minus_1_over_v_times_tf_plus_tb():
    # Narayanan et al. 2021, section 2.2.2: the bubble shrinks v times. The simulator gives
    # this makespan exactly for every m that is a multiple of p.
    for p in range(1, 6):
        for v in range(1, 4):
            for m in range(p, 5 * p + 1, p):
                for cost_f, cost_b in COSTS:
                    timeline = simulate(interleaved_one_f_one_b(p, m, v), cost_f, cost_b)
                    expected = (m + (p - 1) / v) * (cost_f + cost_b)
                    assert timeline.makespan == pytest.approx(expected), (p, m, v)
                    assert timeline.bubble_fraction == pytest.approx(
                        (p - 1) / (v * m + p - 1), abs=1e-12)
                    assert makespan_formula("interleaved", p, m, v, cost_f, cost_b) == \
                        pytest.approx(expected)


def test_zb_h1_matches_the_papers_bubble():
    # Qi et al. 2023: (p-1)(T_F + T_B - T_W) idle per rank, for m >= p and
    # T_W <= min(T_F, T_B) (T_B = cost_b - cost_w is the input-gradient part here).
    for p in range(1, 6):
        for m in range(p, 10):
            for cost_f, cost_b, cost_w in [(1, 2, 1), (1, 3, 1), (1, 2, 0.5), (2, 1, 0.5),
                                           (1.5, 2.5, 1)]:
                timeline = simulate(zb_h1(p, m), cost_f, cost_b, cost_w)
                t_b, t_w = cost_b - cost_w, cost_w
                idle = (p - 1) * (cost_f + t_b - t_w)
                assert timeline.makespan == pytest.approx(m * (cost_f + cost_b) + idle)
                assert timeline.bubble_fraction == pytest.approx(
                    bubble_formula("zb-h1", p, m, cost_f=cost_f, cost_b=cost_b, cost_w=cost_w))


def test_zb_h1_idles_a_third_of_1f1b_with_equal_costs():
    # The paper's headline: T_F = T_B = T_W gives (p-1) T idle instead of 3 (p-1) T.
    for p in range(2, 6):
        for m in range(p, 10):
            zero_bubble = simulate(zb_h1(p, m), 1, 2)
            baseline = simulate(one_f_one_b(p, m), 1, 2)
            assert zero_bubble.makespan - 3 * m == pytest.approx((baseline.makespan - 3 * m) / 3)


def test_zb_h1_and_interleaved_beat_1f1b():
    for p in range(2, 6):
        for m in range(1, 10):
            for cost_f, cost_b, cost_w in [(1, 2, None), (1, 4, 3), (1, 1, 0.1)]:
                baseline = simulate(one_f_one_b(p, m), cost_f, cost_b, cost_w)
                better = simulate(zb_h1(p, m), cost_f, cost_b, cost_w)
                assert better.bubble_fraction < baseline.bubble_fraction
        for m in range(p, 5 * p + 1, p):
            baseline = simulate(one_f_one_b(p, m))
            for v in (2, 3):
                assert simulate(interleaved_one_f_one_b(p, m, v)).bubble_fraction < \
                    baseline.bubble_fraction


def test_peak_in_flight_activations():
    for p, m in SIZES:
        assert simulate(gpipe(p, m)).peak_in_flight == (m,) * p
        expected = tuple(min(p - rank, m) for rank in range(p))
        assert simulate(one_f_one_b(p, m)).peak_in_flight == expected
        # ZB-H1 holds each microbatch's weight-gradient inputs until its W: every rank holds
        # what 1F1B's first rank holds (Qi et al. 2023: the same peak memory as 1F1B's).
        assert simulate(zb_h1(p, m)).peak_in_flight == (min(p, m),) * p


def test_interleaved_holds_one_plus_p_minus_1_over_pv_times_more():
    # In chunk activations (1/v of a rank's layers): warm-up + 1 = (v-1)p + 2(p-r-1) + 1, so
    # rank 0 holds vp + p - 1 chunks = p (1 + (p-1)/(pv)) microbatches' worth (Korthikanti et
    # al. 2022), when m*v allows it.
    for p in range(1, 6):
        for v in (2, 3):
            for m in range(p, 4 * p + 1, p):
                peaks = simulate(interleaved_one_f_one_b(p, m, v)).peak_in_flight
                assert peaks == tuple(min((v - 1) * p + 2 * (p - r - 1) + 1, m * v)
                                      for r in range(p))
    assert simulate(interleaved_one_f_one_b(4, 8, 2)).peak_in_flight[0] == 2 * 4 + 4 - 1


def test_communication_delays_each_hop():
    # GPipe with a message latency c: the first microbatch crosses p-1 links forward and
    # p-1 back, every other pass is hidden behind it.
    for p, m in [(2, 3), (4, 8), (5, 2)]:
        timeline = simulate(gpipe(p, m), comm=0.25)
        assert timeline.makespan == pytest.approx((m + p - 1) * 3 + 2 * (p - 1) * 0.25)
        schedule = one_f_one_b(p, m)
        assert simulate(schedule, comm=0.25).makespan > simulate(schedule).makespan
    one_rank = interleaved_one_f_one_b(1, 2, 3)  # stages on one rank exchange no messages
    assert simulate(one_rank, comm=5.0).makespan == pytest.approx(2 * 3)


def test_passes_start_when_rank_is_free_and_input_arrived():
    timeline = simulate(one_f_one_b(2, 2), cost_f=1, cost_b=2, comm=0.5)
    rank1 = [(str(e.action), e.start, e.end) for e in timeline.on_rank(1)]
    # F0 on rank 1 waits for rank 0's F0 (ends at 1) plus the hop; B0 follows at once
    assert rank1[:2] == [("F0s1", 1.5, 2.5), ("B0s1", 2.5, 4.5)]
    rank0 = [(str(e.action), e.start) for e in timeline.on_rank(0)]
    assert rank0[2] == ("B0s0", 5.0)  # the gradient ends at 4.5, arrives 0.5 later


def test_measured_timelines_use_the_same_numbers():
    schedule = schedule_from_strings(["F0 B0", "F0 B0"], microbatches=1)
    events = (TimedAction(0, Action("F", 0, 0), 10.0, 11.0),
              TimedAction(1, Action("F", 0, 1), 11.0, 12.0),
              TimedAction(1, Action("B", 0, 1), 12.0, 14.0),
              TimedAction(0, Action("B", 0, 0), 14.0, 16.0))
    timeline = Timeline(schedule, events, unit="s")
    assert timeline.makespan == 6.0
    assert timeline.bubble_fraction == pytest.approx(0.5)
    assert timeline.peak_in_flight == (1, 1)


@pytest.mark.parametrize("call, error, message", [
    (lambda: simulate(schedule_from_strings(["B0 F0"], 1)), ScheduleError,
     "microbatch 0 backward before its forward on rank 0"),
    (lambda: simulate(one_f_one_b(2, 2), cost_f=-1), ValueError, "cost_f must be >= 0, got -1"),
    (lambda: simulate(zb_h1(2, 2), cost_b=1, cost_w=2), ValueError,
     r"cost_w \(2\) is part of the backward, so it cannot exceed cost_b \(1\)"),
    (lambda: bubble_formula("dualpipe", 4, 8), ValueError, "no closed form for schedule"),
])
def test_bad_input_is_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()
