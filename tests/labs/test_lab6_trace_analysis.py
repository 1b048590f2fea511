"""Lab 6, graded: the student's reading of traces (``trace_analysis``): per rank the compute,
the communication, the overlapped and the exposed communication and the idle time; the step
time; strong and weak scaling efficiency; per-rank clocks lined up on a shared collective, one
timeline, and the time each rank waits for the last to arrive (the straggler).

Traces built here have known answers: worked out by hand in the comments (times in
microseconds as the profiler writes them), or made from a known truth (each rank's clock
skew, its arrival at every collective) so that the answer is the truth they were made from.
A real trace of a TP block on 2 ranks, recorded now, is checked for what must hold whatever
the timings (TP's blocking collectives overlap nothing; a skew added to one rank's clock is
found again). Two recorded real traces (``tests/labs/data/lab6_traces.json``: lab 5's DDP with
its all-reduces in flight during the backward, a TP block's per-rank traces) are checked
against lab 6's snapshot. The student's functions run in a helper process and return numbers;
tolerance 1e-9 s (sums of a few floats).
"""
import json
import random
from pathlib import Path

import pytest

from reference_impl.checks import raised_in
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import draw, label
from reference_impl.perf.profiling import profile_tp_block_on_rank
from reference_impl.perf.traces import load_trace

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


# Rank 0, one thread: "attn forward" with an all_reduce nested in it, then "mlp backward" with
# another in it. Rank 1 (events out of order, a profiler op that is no range): "mlp backward"
# on thread 1, and on thread 7 (DDP's communication thread) an all_reduce that starts inside it
# and outlives it. The expected times were worked out by hand from the events.
ONE_THREAD_AND_A_COMM_THREAD = [
    event("attn forward", 0, 1200), event("all_reduce", 300, 400),
    event("mlp backward", 1800, 800), event("all_reduce", 2100, 150),
    event("all_reduce", 500, 1100, pid=1, tid=7), event("mlp backward", 200, 900, pid=1),
    event("aten::mm", 250, 50, pid=1),
]
EXPECTED = {
    0: dict(compute_s=1450e-6, comm_s=550e-6, overlapped_s=0.0, exposed_comm_s=550e-6,
            idle_s=600e-6, span_s=2600e-6),
    1: dict(compute_s=900e-6, comm_s=1100e-6, overlapped_s=600e-6, exposed_comm_s=500e-6,
            idle_s=0.0, span_s=1400e-6),
}

# One rank, a pipeline stage: a forward, a batch_isend_irecv and its wait (the bubble: waiting
# for the neighbour), a backward with two nested ranges of other modules, and two overlapping
# all_reduces on a second thread.
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
    for name in QUANTITIES:
        assert name not in found or found[name] >= -ABS, (
            f"{where}: {name} = {found[name]:.6g} s, below zero. Likely mistake: a time counted "
            "twice, e.g. compute and communication that ran at once subtracted one after the "
            "other (the union of intervals counts an overlap once)")
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


STEP_CASES = [(8.0, 2.0, 4), (8.0, 4.0, 4), (3.0, 4.0, 4, True), (3.0, 3.0, 1),
              (5.0, 2.0, 2, False), (6.0, 8.0, 8, True)]
STEP_EFFICIENCIES = [1.0, 0.5, 0.75, 1.0, 1.25, 0.75]


def check_step(impl, run_alone, trace, steps, expected_step, cases, expected):
    step, efficiencies = run_alone(student_step_and_efficiency, impl, trace, steps, cases)
    assert step == pytest.approx(expected_step, abs=ABS), (
        f"step_seconds over {steps} steps = {step:.6g} s, expected {expected_step:.6g} s: a "
        "step is as slow as its slowest rank")
    for case, value, want in zip(cases, efficiencies, expected):
        weak = len(case) > 3 and case[3]
        rule = ("weak scaling: the problem grows with N" if weak
                else "strong scaling: the same problem on N ranks")
        assert value == pytest.approx(want, abs=1e-12), (
            f"scaling_efficiency{case} = {value}, expected {want} ({rule})")


def test_step_time_and_scaling_efficiency(impl, run_alone):
    check_step(impl, run_alone, ONE_THREAD_AND_A_COMM_THREAD, 2, 1300e-6, STEP_CASES,
               STEP_EFFICIENCIES)


# ------------------------------------------------ traces made from a known truth

def made_trace(seed, ranks):
    """A trace of ``ranks`` ranks (process ids shuffled, events shuffled), each a run of
    segments whose contribution is known by construction: compute alone; a blocking collective
    nested in a module's range; a collective on another thread under compute (overlapped); a
    launch and its time in flight on two threads, nothing computing (exposed, counted once);
    nested module ranges (counted once); zero-length ranges; idle gaps. Returns the events and
    {rank (in process order): expected quantities}."""
    rng = random.Random(seed)
    pids = rng.sample(range(100, 100 + 50 * ranks), ranks)
    events, expected = [], {}
    for pid in pids:
        t, total = rng.randrange(0, 5000), dict.fromkeys(QUANTITIES, 0.0)
        start = t
        kinds = ["compute", "blocked", "overlapped", "in flight", "nested", "idle", "zero"]
        segments = ["compute"] + rng.sample(kinds, len(kinds)) + ["blocked"]
        for kind in segments:
            d = rng.randrange(100, 900)
            a, c = rng.randrange(1, d // 3), rng.randrange(1, d // 3)  # a + c < d
            if kind == "compute":
                events.append(event("mlp forward", t, d, pid))
                total["compute_s"] += d
            elif kind == "blocked":  # the thread waits in the collective
                events += [event("attn backward", t, d, pid), event("all_reduce", t + a, c, pid)]
                total["compute_s"] += d - c
                total["comm_s"] += c
                total["exposed_comm_s"] += c
            elif kind == "overlapped":  # another thread's collective under the compute
                events += [event("mlp backward", t, d, pid),
                           event("all_reduce in flight", t + a, c, pid, tid=1_000_000_000)]
                total["compute_s"] += d
                total["comm_s"] += c
                total["overlapped_s"] += c
            elif kind == "in flight":  # a launch and its time in flight, nothing computing
                events += [event("all_reduce", t, c, pid),
                           event("all_reduce in flight", t, d, pid, tid=1_000_000_001)]
                total["comm_s"] += d
                total["exposed_comm_s"] += d
            elif kind == "nested":  # a stage's range and its modules' ranges inside it
                events += [event("stage 0 mb 1 block0 forward", t, d, pid),
                           event("attn forward", t + a, c, pid),
                           event("mlp forward", t + a + c // 2, c, pid)]
                total["compute_s"] += d
            elif kind == "idle":
                total["idle_s"] += d
            elif kind == "zero":  # zero-length ranges add nothing
                events += [event("ln1 forward", t, 0, pid), event("all_reduce wait", t, 0, pid)]
                d = 0
            t += d
            if kind != "idle":
                events.append(event("aten::mm", t - d // 2, 5, pid))  # a profiler op, no range
        total["span_s"] = t - start
        expected[pid] = {name: value * 1e-6 for name, value in total.items()}
    rng.shuffle(events)
    return events, [expected[pid] for pid in sorted(pids)]


def check_made_traces(impl, run_alone, seed, worlds=(1, 2, 5)):
    """rank_time on traces made from a known truth, several ranks each (module docstring)."""
    made = [made_trace(seed + index, ranks) for index, ranks in enumerate(worlds)]
    found = run_alone(student_many_breakdowns, impl, [events for events, _ in made])
    for (events, expected), ranks, world in zip(made, found, worlds):
        assert len(ranks) == world, (
            f"breakdown returned {len(ranks)} ranks for a trace of {world} processes: one "
            "RankTime per process (pid), in process order")
        for index, (mine, truth) in enumerate(zip(ranks, expected)):
            assert_rank(mine, truth, f"rank {index} of a made-up trace of {world} ranks "
                                     f"(seed {seed}, events shuffled)")


def student_many_breakdowns(impl, traces):
    return [student_breakdown(impl, {"traceEvents": events}) for events in traces]


def test_traces_made_from_a_known_truth(impl, run_alone, sweep_seed):
    check_made_traces(impl, run_alone, sweep_seed)


# ------------------------------------------------ a real TP block, recorded now

def shifted(path, seconds):
    """A rank's own trace with every timestamp moved by ``seconds`` (its clock skewed)."""
    trace = load_trace(path)
    return {"traceEvents": [dict(e, ts=e["ts"] + seconds * 1e6) if "ts" in e else e
                            for e in trace.get("traceEvents", [])]}


def student_tp_block(impl, paths, skews):
    analysis = impl.module("trace_analysis")
    per_rank = {rank: shifted(paths[rank], skews[rank]) for rank in sorted(skews, reverse=True)}
    ranks = student_breakdown(impl, analysis.aligned_timeline(per_rank))
    return ranks, {int(r): float(o) for r, o in analysis.clock_offsets(per_rank).items()}


SKEW_SLACK = 0.05  # s: on one machine the ranks share a clock, but leave a collective up to
#                    milliseconds apart under load


def check_live_tp_block(impl, run_on_ranks, run_alone, tmp_path, skews):
    paths = [result["path"] for result in
             run_on_ranks(profile_tp_block_on_rank, 2, str(tmp_path), 2, 32, 4, 16, 2)]
    ranks, offsets = run_alone(student_tp_block, impl, paths, skews)
    for rank in sorted(skews):
        truth = skews[min(skews)] - skews[rank]
        assert abs(offsets[rank] - truth) < SKEW_SLACK, (
            f"clock_offsets on a real TP block's traces with rank {rank}'s clock skewed by "
            f"{skews[rank]:+g} s (the lowest rank's by {skews[min(skews)]:+g} s): "
            f"{offsets[rank]:+.4f} s, expected about {truth:+g} s. Likely mistake: "
            f"{offset_diagnosis(offsets[rank], truth, SKEW_SLACK)}")
    assert [rank["rank"] for rank in ranks] == sorted(skews), (
        f"aligned_timeline's processes are {[rank['rank'] for rank in ranks]}: each rank's "
        "events move to process `rank`")
    for mine in ranks:
        where = f"rank {mine['rank']} of a TP block's aligned timeline"
        # every collective here is called on the thread that computes: nothing overlaps
        assert mine["comm_s"] > 0 and mine["compute_s"] > 0, (where, mine)
        assert_rank(mine, dict(overlapped_s=0.0, exposed_comm_s=mine["comm_s"]), where)
        assert mine["span_s"] >= mine["compute_s"] + mine["comm_s"] - ABS, (
            f"{where}: compute + communication exceed the span. Likely mistake: "
            f"{MISTAKES['compute_s']}")
        assert mine["idle_s"] == pytest.approx(
            mine["span_s"] - mine["compute_s"] - mine["comm_s"], abs=ABS), (
            f"{where}: {MISTAKES['idle_s']}")
        assert mine["span_s"] < 60, (
            f"{where} spans {mine['span_s']:.1f} s: the ranks' timestamps were not moved onto "
            "one clock (ts is in microseconds: an offset in seconds is 1e6 of them)")


def test_a_real_trace_of_a_tp_block(impl, run_on_ranks, run_alone, tmp_path):
    # rank 1's clock 2.5 s ahead: its offset is about -2.5 s
    check_live_tp_block(impl, run_on_ranks, run_alone, tmp_path, {0: 0.0, 1: 2.5})


# ------------------------------------------------ lab 5's DDP, recorded: overlapped and exposed

RECORDED = Path(__file__).resolve().parent / "data" / "lab6_traces.json"


def recorded(name):
    return json.loads(RECORDED.read_text())[name]


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


def ddp_diagnosis(name, value, right, wrong_answers):
    for mistake, wrong in wrong_answers.items():
        if name in wrong and value == pytest.approx(wrong[name], abs=ABS) \
                and wrong[name] != pytest.approx(right, abs=ABS):
            return DDP_MISTAKES[mistake]
    return MISTAKES[name]


def check_recorded_ddp(impl, run_alone):
    expected, wrong = snapshot("lab6", "ddp"), snapshot("lab6", "ddp_mistakes")
    found = run_alone(student_breakdown, impl, recorded("ddp_small_buckets"))
    assert [rank["rank"] for rank in found] == sorted(expected), found
    for rank in found:
        for name, value in expected[rank["rank"]].items():
            assert rank[name] == pytest.approx(value, abs=ABS), (
                f"rank {rank['rank']} of lab 5's DDP (recorded; small buckets, all-reduces "
                f"launched during the backward): {name} = {rank[name]:.6g} s, expected "
                f"{value:.6g} s. Likely mistake: "
                f"{ddp_diagnosis(name, rank[name], value, wrong[rank['rank']])}")


def test_the_exposed_communication_of_lab5s_ddp(impl, run_alone):
    check_recorded_ddp(impl, run_alone)


# ------------------------------------------------ per-rank clocks, one timeline, the straggler

ANCHOR_LATENCY_US = 40  # a collective ends this long after the last rank joins it
JITTER_US = 900  # one rank's one collective ends this much late in its trace (a noisy sample)


def skewed_ranks(world, rounds, seed, straggler):
    """Per-rank traces of ``rounds`` steps on ``world`` ranks, each rank's clock skewed: every
    step each rank computes (random times; ``straggler`` longest), then joins an all_reduce
    that ends ANCHOR_LATENCY_US after the last rank joins. One rank's one all_reduce is
    recorded JITTER_US late. Events shuffled, process ids arbitrary, compute ranges nested,
    a DDP-style in-flight range and a profiler op beside them. Returns the traces {rank:
    trace}, in a shuffled rank order that does not start with rank 0, and the truth: the
    offsets to rank 0's clock, the waits (true time), the jittered rank and the events' true
    times."""
    rng = random.Random(seed)
    skews = {rank: rng.choice([1.0, -1.0]) * rng.uniform(0.5, 5.0) for rank in range(world)}
    jittered = rng.randrange(1, world)
    late_round = rng.randrange(rounds)
    events = {rank: [] for rank in range(world)}
    waits = dict.fromkeys(range(world), 0.0)
    t = 0.0
    for k in range(rounds):
        compute = {rank: rng.randrange(200, 800) + (900 if rank == straggler else 0)
                   for rank in range(world)}
        joins = {rank: t + compute[rank] for rank in range(world)}
        end = max(joins.values()) + ANCHOR_LATENCY_US
        for rank in range(world):
            late = JITTER_US if (rank, k) == (jittered, late_round) else 0
            pid = 7000 + 13 * rank
            events[rank] += [
                event("mlp forward", t, compute[rank], pid),
                event("attn forward", t + 10, compute[rank] // 2, pid),  # nested
                event("all_reduce", joins[rank], end - joins[rank] + late, pid),
                event("all_reduce in flight", t + 5, 50, pid, tid=1_000_000_000),
                event("aten::mm", t + 20, 30, pid),
            ]
            waits[rank] += (max(joins.values()) - joins[rank]) * 1e-6
        t = end + rng.randrange(0, 300)
    traces, order = {}, rng.sample(range(world), world)
    for rank in order[::-1] if order[0] == 0 else order:  # never the lowest rank first
        shuffled = [dict(e, ts=e["ts"] + skews[rank] * 1e6) for e in events[rank]]
        rng.shuffle(shuffled)
        traces[rank] = {"traceEvents": shuffled}
    truth = {"offsets": {rank: skews[0] - skews[rank] for rank in range(world)},
             "waits": waits, "jittered": jittered, "rounds": rounds, "skews": skews,
             "events": events}
    return traces, truth


def offset_diagnosis(found, truth, slack=1e-9, mean=None, other_reference=None):
    if truth and abs(found + truth) < slack:
        return ("the offset has the opposite sign: it is what this rank's timestamps need added "
                "to read them on the lowest rank's clock")
    if mean is not None and abs(found - mean) < slack:
        return ("one of this rank's all_reduce ends was recorded late, and the offset moved "
                "with it: one late end among many must not move it")
    if other_reference is not None and abs(found - other_reference) < slack:
        return ("the offsets are to the lowest rank's clock, whatever order the traces come "
                "in, not to the first rank given")
    return ("the k-th all_reduce ends together on every rank: read on the lowest rank's clock, "
            "this rank's ends should fall on the lowest rank's")


def student_clocks(impl, traces, anchor="all_reduce"):
    analysis = impl.module("trace_analysis")
    offsets = analysis.clock_offsets(traces, anchor)
    timeline = analysis.aligned_timeline(traces, anchor)
    waits = analysis.arrival_waits(timeline, anchor)
    return ({int(r): float(o) for r, o in offsets.items()},
            [{key: e[key] for key in ("name", "pid", "ts", "dur")}
             for e in timeline["traceEvents"]],
            {int(r): float(w) for r, w in waits.items()}, int(analysis.straggler(waits)))


def check_clocks(impl, run_alone, seed, worlds=(2, 3, 4, 8)):
    configs = draw({"world": list(worlds), "rounds": [3, 5, 8]}, seed)
    made = []
    for index, config in enumerate(configs):
        straggler = (seed + index) % config["world"]
        traces, truth = skewed_ranks(config["world"], config["rounds"], seed * 100 + index,
                                     straggler)
        made.append((config, straggler, traces, truth))
    ties = tie_cases(seed)
    found, chosen = run_alone(student_many_clocks, impl, [traces for _, _, traces, _ in made],
                              [waits for waits, _ in ties])
    for (config, straggler, traces, truth), result in zip(made, found):
        check_one_clock(config, straggler, traces, truth, result, seed)
    for (waits, lowest), got in zip(ties, chosen):
        tied = sorted(rank for rank, wait in waits.items() if wait == 0.0)
        assert got == lowest, (
            f"straggler({waits}) = rank {got}, expected rank {lowest} [seed {seed}]: ranks "
            f"{tied} wait least, a tie, and a tie goes to the lowest rank whatever order the "
            "waits come in")


def tie_cases(seed: int, count: int = 4) -> list[tuple[dict[int, float], int]]:
    """Waits out of rank order in which two ranks share the least wait, the higher of them
    given first: (waits, the lower of the two)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        world = rng.randrange(3, 9)
        low, high = sorted(rng.sample(range(world), 2))
        others = [rank for rank in range(world) if rank not in (low, high)]
        rng.shuffle(others)
        order = [high, *others[:1], low, *others[1:]]
        cases.append(({rank: 0.0 if rank in (low, high) else rng.uniform(1e-4, 1e-3)
                       for rank in order}, low))
    return cases


def student_many_clocks(impl, many, ties):
    analysis = impl.module("trace_analysis")
    return ([student_clocks(impl, traces) for traces in many],
            [int(analysis.straggler(waits)) for waits in ties])


def check_one_clock(config, straggler, traces, truth, result, seed):
    offsets, timeline, waits, chosen = result
    where = (f"{config['world']} ranks, {config['rounds']} all_reduces, traces given in rank "
             f"order {list(traces)} [{label(config, seed)}]")
    assert sorted(offsets) == list(range(config["world"])), (
        f"clock_offsets ({where}) returned ranks {sorted(offsets)}: one offset per rank")
    first_given = next(iter(traces))
    for rank, value in offsets.items():
        right = truth["offsets"][rank]
        late = JITTER_US * 1e-6 / truth["rounds"] if rank == truth["jittered"] else 0.0
        to_first_given = truth["skews"][first_given] - truth["skews"][rank]
        assert value == pytest.approx(right, abs=1e-9), (
            f"clock_offsets ({where}): rank {rank} {value:+.9f} s, expected {right:+.9f} s "
            f"(its clock is {truth['skews'][rank]:+.6f} s off, rank 0's "
            f"{truth['skews'][0]:+.6f} s). Likely mistake: "
            f"{offset_diagnosis(value, right, 1e-9, right - late, to_first_given)}")
    events = {}
    for e in timeline:
        events.setdefault(e["pid"], []).append(e)
    assert sorted(events) == list(range(config["world"])), (
        f"aligned_timeline ({where}) has processes {sorted(events)}: every rank's events move "
        "to process `rank`")
    assert [e["ts"] for e in timeline] == sorted(e["ts"] for e in timeline), (
        f"aligned_timeline ({where}): the events are not sorted by their start")
    for rank, mine in events.items():
        truth_events = sorted((e["name"], e["ts"] + truth["skews"][0] * 1e6)
                              for e in truth["events"][rank] if e["name"] != "aten::mm")
        got = sorted((e["name"], e["ts"]) for e in mine)
        assert len(got) == len(truth_events), (
            f"aligned_timeline ({where}): rank {rank} has {len(got)} events, its trace "
            f"{len(truth_events)} ranges: keep every range event of every rank")
        for (name, ts), (_, want) in zip(got, truth_events):
            assert ts == pytest.approx(want, abs=1e-3), (
                f"aligned_timeline ({where}): rank {rank}'s {name!r} starts at {ts:.3f} us, on "
                f"rank 0's clock at {want:.3f} us. Likely mistake: ts is in microseconds, the "
                "offsets in seconds (x 1e6), and each rank moves by its own offset")
    for rank, value in waits.items():
        right = truth["waits"][rank]
        assert value == pytest.approx(right, abs=1e-9), (
            f"arrival_waits ({where}): rank {rank} waited {value * 1e6:.3f} us, expected "
            f"{right * 1e6:.3f} us. Likely mistake: a rank waits from its own arrival (its "
            "all_reduce's start) to the last rank's arrival at the same collective, summed "
            "over the collectives; the ends are the same on every rank and tell nothing")
    assert chosen == straggler, (
        f"straggler ({where}) = rank {chosen}, expected rank {straggler} (it computes longest; "
        f"waits {waits}): the straggler is the rank the others wait for; which rank's waits "
        "show that?")


def clocks_or_error(impl, traces):
    """``student_clocks`` of ``traces``, or the function of the submission that raised and
    its error."""
    try:
        return student_clocks(impl, traces), None
    except Exception as error:  # named in the test with the function that raised it
        function = raised_in(error, "trace_analysis.py") or "the analysis"
        return None, f"{function} raised {type(error).__name__}: {error}"


def test_the_lowest_rank_given_sets_the_clock_when_rank_0_is_not_among_them(impl, run_alone):
    """One node's ranks, 4 to 7, without rank 0: the offsets are to rank 4's clock, the
    timeline's processes and the waits are ranks 4 to 7, the straggler one of them."""
    first, world, straggler = 4, 4, 2
    traces, truth = skewed_ranks(world, 5, 77, straggler)
    node = {rank + first: trace for rank, trace in traces.items()}
    found, raised = run_alone(clocks_or_error, impl, node)
    ranks = list(range(first, first + world))
    where = f"traces of ranks {list(node)} (one node's, no rank 0)"
    assert raised is None, f"{raised} on {where}"
    offsets, timeline, waits, chosen = found
    assert sorted(offsets) == ranks, (
        f"clock_offsets ({where}) returned ranks {sorted(offsets)}, expected {ranks}")
    for rank in ranks:
        right = truth["offsets"][rank - first]
        assert offsets[rank] == pytest.approx(right, abs=1e-9), (
            f"clock_offsets ({where}): rank {rank} {offsets[rank]:+.9f} s, expected "
            f"{right:+.9f} s, to the clock of rank {first}, the lowest rank given")
    assert sorted({e["pid"] for e in timeline}) == ranks, (
        f"aligned_timeline ({where}) has processes {sorted({e['pid'] for e in timeline})}, "
        f"expected {ranks}")
    assert sorted(waits) == ranks and chosen == straggler + first, (
        f"arrival_waits and straggler ({where}): waits for ranks {sorted(waits)}, straggler "
        f"rank {chosen}, expected ranks {ranks} and rank {straggler + first}")


def test_clocks_timeline_and_straggler(impl, run_alone, sweep_seed):
    check_clocks(impl, run_alone, sweep_seed)


def student_refusals(impl, cases):
    analysis = impl.module("trace_analysis")
    found = []
    for function, argument in cases:
        try:
            getattr(analysis, function)(argument)
        except ValueError as error:
            found.append(str(error))
        else:
            found.append(None)
    return found


def check_refusals(impl, run_alone, seed, world=3):
    """A rank without the anchor, or with another number of them, is refused by name."""
    traces, _ = skewed_ranks(world, 4, seed, 0)
    lacking = {**traces, world - 1: {"traceEvents": []}}
    last = max((e for e in traces[1]["traceEvents"] if e["name"] == "all_reduce"),
               key=lambda e: e["ts"])
    fewer = {**traces, 1: {"traceEvents": [e for e in traces[1]["traceEvents"] if e is not last]}}
    merged = [dict(e, pid=rank) for rank, trace in fewer.items() for e in trace["traceEvents"]]
    cases = [("clock_offsets", lacking), ("clock_offsets", fewer),
             ("arrival_waits", {"traceEvents": merged})]
    found = run_alone(student_refusals, impl, cases)
    what = [f"clock_offsets with rank {world - 1}'s trace empty",
            "clock_offsets with rank 1 missing its last all_reduce",
            "arrival_waits on a timeline where rank 1 has one all_reduce fewer"]
    names = [(str(world - 1), "0"), ("1", "3", "4"), ("3", "4")]
    for case, message, numbers in zip(what, found, names):
        assert message is not None, (
            f"{case}: no ValueError. The clocks line up on the same collectives on every rank "
            "(every rank's k-th), so a rank without them, or with another number of them, "
            "must be refused")
        for number in numbers:
            assert number in message, (
                f"{case}: the error {message!r} does not name {number}: name the rank and the "
                "counts")


def test_ranks_without_matching_collectives_are_refused(impl, run_alone, sweep_seed):
    check_refusals(impl, run_alone, sweep_seed)


def check_recorded_alignment(impl, run_alone, cases="public"):
    """The recorded TP block's per-rank traces, skewed: against the reference's reading."""
    skews = snapshot("lab6", f"tp_skews/{cases}")
    per_rank = recorded("tp_block_per_rank")
    traces = {rank: {"traceEvents": [dict(e, ts=e["ts"] + skews[rank] * 1e6)
                                     for e in per_rank[str(rank)]["traceEvents"]]}
              for rank in sorted(skews, reverse=True)}
    offsets, _, waits, chosen = run_alone(student_clocks, impl, traces)
    for rank, value in snapshot("lab6", f"tp_offsets/{cases}").items():
        assert offsets[rank] == pytest.approx(value, abs=1e-9), (
            f"clock_offsets on the recorded TP block (rank {rank}'s clock {skews[rank]:+g} s "
            f"off): {offsets[rank]:+.9f} s, expected {value:+.9f} s. Likely mistake: "
            f"{offset_diagnosis(offsets[rank], value)}")
    for rank, value in snapshot("lab6", f"tp_waits/{cases}").items():
        assert waits[rank] == pytest.approx(value, abs=1e-9), (
            f"arrival_waits on the recorded TP block: rank {rank} {waits[rank] * 1e6:.3f} us, "
            f"expected {value * 1e6:.3f} us: from its all_reduce's start to the last rank's, "
            "summed over the all_reduces")
    assert chosen == snapshot("lab6", f"tp_straggler/{cases}"), (
        f"straggler on the recorded TP block = {chosen}: the rank that waits least")


def test_a_recorded_tp_block_on_skewed_clocks(impl, run_alone):
    check_recorded_alignment(impl, run_alone)
