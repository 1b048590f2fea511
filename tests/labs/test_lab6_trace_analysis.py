"""Lab 6, graded: the student's reading of a merged trace (``trace_analysis``): per rank the
compute, the communication, the overlapped and the exposed communication and the idle time;
the step time; strong and weak scaling efficiency.

Traces built here have known answers (worked out by hand in the comments, times in
microseconds as the profiler writes them); a real trace of a TP block on 2 ranks is checked
against the kit's own summary (``perf/trace_summary.summarize``); a real trace of lab 5's DDP
(``OverlappingDataParallel``, small buckets: all-reduces in flight during the backward, on the
"collectives in flight" row) against numbers this file works out from the trace's ranges by
rank and thread (``perf/traces.ranges_by_rank``) with the interval helpers of
``perf/intervals``. The student's functions run in a helper process
and return numbers; tolerance 1e-9 s (sums of a few floats).
"""
import pytest

from reference_impl.perf.intervals import difference, overlap, union, union_length
from reference_impl.perf.profiling import profile_ddp_on_rank, profile_tp_block_on_rank
from reference_impl.perf.trace_summary import summarize
from reference_impl.perf.traces import merge_traces, range_events, ranges_by_rank

pytestmark = pytest.mark.lab6

ABS = 1e-9
QUANTITIES = ("compute_s", "comm_s", "overlapped_s", "exposed_comm_s", "idle_s", "span_s")
MISTAKES = {
    "compute_s": "compute counts a collective nested in a module's range (a thread blocked in "
                 "a collective is waiting, not computing), or removes communication that ran on "
                 "another thread (only the same thread's communication blocks it)",
    "comm_s": "communication is the union of every thread's communication ranges, counted once "
              "where they overlap",
    "overlapped_s": "overlapped is the communication that runs while compute runs (the "
                    "intersection of the two), not zero and not all of it",
    "exposed_comm_s": "exposed communication is communication minus the overlapped part",
    "idle_s": "idle is the span (first start to last end) in neither compute nor communication",
    "span_s": "the span runs from the rank's first range's start to its last range's end",
}


def event(name, start_us, duration_us, pid=0, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": pid, "tid": tid,
            "ts": start_us, "dur": duration_us}


# Rank 0, one thread: "attn forward" 0-1000 with an all_reduce 400-600 nested in it, then
# "mlp backward" 1500-2500 with an all_reduce 2000-2300 in it. Compute 800 + 700 = 1500,
# comm 200 + 300 = 500, nothing overlapped (the thread waited): exposed 500; span 0-2500,
# idle 1000-1500 = 500.
# Rank 1 (events out of order, a profiler op that is no range): "mlp backward" 100-900 on
# thread 1, and on thread 7 (DDP's communication thread) an all_reduce 500-1300.
# Compute 800 (its own thread has no comm), comm 800, overlapped 500-900 = 400, exposed 400;
# span 100-1300, idle 0.
ONE_THREAD_AND_A_COMM_THREAD = [
    event("attn forward", 0, 1000), event("all_reduce", 400, 200),
    event("mlp backward", 1500, 1000), event("all_reduce", 2000, 300),
    event("all_reduce", 500, 800, pid=1, tid=7), event("mlp backward", 100, 800, pid=1),
    event("aten::mm", 150, 50, pid=1),
]
EXPECTED = {
    0: dict(compute_s=1500e-6, comm_s=500e-6, overlapped_s=0.0, exposed_comm_s=500e-6,
            idle_s=500e-6, span_s=2500e-6),
    1: dict(compute_s=800e-6, comm_s=800e-6, overlapped_s=400e-6, exposed_comm_s=400e-6,
            idle_s=0.0, span_s=1200e-6),
}

# One rank, a pipeline stage: "stage 1 mb 0 block0 forward" 0-300; batch_isend_irecv 300-320;
# its wait 320-900 (the bubble: waiting for the neighbour); the backward 900-1500 with two
# nested ranges of other modules (counted once) 1000-1200 and 1100-1400. Two all_reduces on
# a second thread 1200-1600 and 1550-1700 (overlapping: the union is 1200-1700, 500).
# Compute: 0-300 and 900-1500 = 900; comm: 300-900 (600) and 1200-1700 (500) = 1100;
# overlapped 1200-1500 = 300; exposed 800; span 0-1700, busy 0-1700: idle 0.
PIPELINE_STAGE = [
    event("stage 1 mb 0 block0 forward", 0, 300), event("batch_isend_irecv", 300, 20),
    event("batch_isend_irecv wait", 320, 580), event("stage 1 mb 0 block0 backward", 900, 600),
    event("attn backward", 1000, 200), event("mlp backward", 1100, 300),
    event("all_reduce", 1200, 400, tid=2), event("all_reduce", 1550, 150, tid=2),
]
EXPECTED_STAGE = dict(compute_s=900e-6, comm_s=1100e-6, overlapped_s=300e-6,
                      exposed_comm_s=800e-6, idle_s=0.0, span_s=1700e-6)


def student_breakdown(impl, trace):
    ranks = impl.module("trace_analysis").breakdown(trace)
    return [{"rank": int(rank.rank), **{name: float(getattr(rank, name)) for name in QUANTITIES}}
            for rank in ranks]


def assert_rank(found, expected, where):
    for name, value in expected.items():
        assert found[name] == pytest.approx(value, abs=ABS), (
            f"{where}: {name} = {found[name]:.6g} s, expected {value:.6g} s. Likely mistake: "
            f"{MISTAKES[name]}")


def test_compute_communication_and_exposure_per_rank(impl, run_alone):
    found = run_alone(student_breakdown, impl, {"traceEvents": ONE_THREAD_AND_A_COMM_THREAD})
    assert [rank["rank"] for rank in found] == [0, 1], (
        f"breakdown returned ranks {[rank['rank'] for rank in found]}: one RankTime per process "
        "(pid) of the trace, in rank order")
    for rank, expected in EXPECTED.items():
        assert_rank(found[rank], expected, f"rank {rank}")


def test_a_pipeline_stage_with_nested_ranges_and_a_communication_thread(impl, run_alone):
    found = run_alone(student_breakdown, impl, PIPELINE_STAGE)
    assert len(found) == 1, found
    assert_rank(found[0], EXPECTED_STAGE, "a pipeline stage")


def student_step_and_efficiency(impl, trace, steps, cases):
    analysis = impl.module("trace_analysis")
    step = analysis.step_seconds(analysis.breakdown(trace), steps)
    return float(step), [float(analysis.scaling_efficiency(*case)) for case in cases]


def test_step_time_and_scaling_efficiency(impl, run_alone):
    # Rank 0 spans 2500 us, rank 1 1200 us: over 2 steps, 1250 us per step (the slowest rank).
    cases = [(8.0, 2.0, 4), (8.0, 4.0, 4), (3.0, 4.0, 4, True), (3.0, 3.0, 1), (5.0, 2.0, 2, False),
             (6.0, 8.0, 8, True)]
    expected = [1.0, 0.5, 0.75, 1.0, 1.25, 0.75]
    step, efficiencies = run_alone(student_step_and_efficiency, impl,
                                   ONE_THREAD_AND_A_COMM_THREAD, 2, cases)
    assert step == pytest.approx(1250e-6, abs=ABS), (
        f"step_seconds = {step:.6g} s, expected 1.25e-3 s: a step is as slow as its slowest "
        "rank (the longest span, not the mean over ranks), divided by the number of steps")
    for case, value, want in zip(cases, efficiencies, expected):
        weak = len(case) > 3 and case[3]
        rule = "weak scaling: T1 / TN" if weak else "strong scaling: T1 / (N TN)"
        assert value == pytest.approx(want, abs=1e-12), (
            f"scaling_efficiency{case} = {value}, expected {want} ({rule})")


def test_a_real_trace_of_a_tp_block(impl, run_on_ranks, run_alone, tmp_path):
    paths = [result["path"] for result in
             run_on_ranks(profile_tp_block_on_rank, 2, str(tmp_path), 2, 32, 4, 16, 2)]
    merged = str(tmp_path / "merged.json")
    merge_traces(paths, merged)
    found = run_alone(student_breakdown, impl, merged)
    expected = summarize(merged)
    assert len(found) == len(expected) == 2, found
    for rank, (mine, kit) in enumerate(zip(found, expected)):
        # every collective here is called on the thread that computes: nothing overlaps
        assert_rank(mine, dict(compute_s=kit.compute_s, comm_s=kit.comm_s, overlapped_s=0.0,
                               exposed_comm_s=kit.comm_s), f"rank {rank} of a TP block's trace")
        assert mine["span_s"] >= mine["compute_s"] + mine["comm_s"] - ABS, mine
        assert mine["idle_s"] == pytest.approx(
            mine["span_s"] - mine["compute_s"] - mine["comm_s"], abs=ABS), (
            f"rank {rank}: {MISTAKES['idle_s']}")


# ------------------------------------------------ lab 5's DDP: overlapped and exposed

DDP_WIDTH, DDP_LAYERS, DDP_BATCH, DDP_STEPS = 256, 4, 64, 2
ONE_LAYER_PER_BUCKET = (DDP_WIDTH + 1) * DDP_WIDTH * 4  # a layer's weight and bias, fp32


def ddp_expected(events):
    """Per rank, from the events: the quantities as HTA defines them, and what the headline
    mistakes would give instead (to name the one a wrong number matches)."""
    expected = {}
    for pid, by_thread in sorted(ranges_by_rank(events).items()):
        comm = union([i for t in by_thread.values() for i in t["comm"]])
        compute = union([i for t in by_thread.values()
                         for i in difference(union(t["compute"]), union(t["comm"]))])
        every_compute = union([i for t in by_thread.values() for i in t["compute"]])
        in_flight = union([i for t in by_thread.values() for i in t["comm"]
                           if not t["compute"]])  # the rows with communication only
        on_compute_threads = union([i for t in by_thread.values() if t["compute"]
                                    for i in t["comm"]])
        comm_s, overlapped_s = union_length(comm), overlap(compute, comm)
        expected[pid] = {
            "right": dict(compute_s=union_length(compute), comm_s=comm_s,
                          overlapped_s=overlapped_s, exposed_comm_s=comm_s - overlapped_s),
            # the in-flight rows read as compute: communication only the calls and waits
            "in flight as compute": dict(comm_s=union_length(on_compute_threads),
                                         compute_s=union_length(union(compute + in_flight))),
            # every thread's communication taken from the compute
            "other threads subtracted": dict(
                compute_s=union_length(every_compute) - overlap(every_compute, comm),
                overlapped_s=0.0),
            "overlapped as exposed": dict(overlapped_s=0.0, exposed_comm_s=comm_s),
            # each thread's communication summed: the call and its time in flight twice
            "comm summed over threads": dict(
                comm_s=sum(union_length(t["comm"]) for t in by_thread.values()),
                exposed_comm_s=sum(union_length(t["comm"]) for t in by_thread.values())
                - overlapped_s),
        }
    return expected


DDP_MISTAKES = {
    "in flight as compute": "the 'all_reduce in flight' ranges (the 'collectives in flight' "
                            "row, a thread with no compute ranges) are communication: the "
                            "all-reduce travelling while the backward runs, not compute",
    "other threads subtracted": "only a thread's own communication is taken from its compute: "
                                "the all-reduce in flight on another row overlaps the backward, "
                                "it does not stop it",
    "overlapped as exposed": "the communication in flight while the backward computes is "
                             "overlapped, not exposed: exposed is only what nothing hides",
    "comm summed over threads": "an all-reduce's call on the computing thread and its time in "
                                "flight on the 'collectives in flight' row overlap (so do "
                                "buckets in flight together, on rows of their own): "
                                "communication is the union over every thread, counted once, "
                                "not a sum per thread",
}


def ddp_diagnosis(name, value, candidates):
    for mistake, wrong in candidates.items():
        if mistake != "right" and name in wrong and value == pytest.approx(wrong[name], abs=ABS) \
                and wrong[name] != pytest.approx(candidates["right"][name], abs=ABS):
            return DDP_MISTAKES[mistake]
    return MISTAKES[name]


def test_the_exposed_communication_of_lab5s_ddp(impl, run_on_ranks, run_alone, tmp_path):
    # the reference DDP of lab 5 (not this lab's module) writes the trace; the student's
    # breakdown reads it in a helper process
    results = run_on_ranks(profile_ddp_on_rank, 2, str(tmp_path), ONE_LAYER_PER_BUCKET,
                           DDP_STEPS, DDP_WIDTH, DDP_LAYERS, DDP_BATCH)
    events = range_events(merge_traces([result["path"] for result in results]))
    assert any(e["name"] == "all_reduce in flight" for e in events), "no time in flight traced"
    found = run_alone(student_breakdown, impl, {"traceEvents": events})
    expected = ddp_expected(events)
    assert [rank["rank"] for rank in found] == sorted(expected), found
    for rank in found:
        candidates = expected[rank["rank"]]
        for name, value in candidates["right"].items():
            assert rank[name] == pytest.approx(value, abs=ABS), (
                f"rank {rank['rank']} of lab 5's DDP (small buckets, all-reduces launched "
                f"during the backward): {name} = {rank[name]:.6g} s, expected {value:.6g} s. "
                f"Likely mistake: {ddp_diagnosis(name, rank[name], candidates)}")
        assert rank["overlapped_s"] > 0, (
            f"rank {rank['rank']}: no overlapped communication in a DDP whose all-reduces are "
            f"in flight during the backward. Likely mistake: {DDP_MISTAKES['overlapped as exposed']}")
