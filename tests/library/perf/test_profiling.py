"""Profiling (``reference_impl.perf``): named ranges, per-rank traces, merge, summary.

One 2-rank launch profiles a TP block for a few steps (``profile_tp_block_on_rank``) and the
tests read what it wrote; the rest runs in this process. Times are never asserted.
"""
import json

import pytest
import torch
import torch.distributed as dist
from torch.profiler import profile

from reference_impl.comm.launcher import launch
from reference_impl.model import Block, ModelConfig
from reference_impl.perf.profiling import profile_tp_block_on_rank
from reference_impl.perf.ranges import COMM_OPS, profiled, range_kind
from reference_impl.perf.trace_summary import summarize
from reference_impl.perf.traces import load_trace, merge_traces, range_events

STEPS, TP = 2, 2


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    results = launch(profile_tp_block_on_rank, TP, str(out / "on"), STEPS)
    off = launch(profile_tp_block_on_rank, TP, str(out / "off"), STEPS, enabled=False)
    merged_path = out / "merged.json"
    merged = merge_traces([result["path"] for result in results], str(merged_path))
    return results, off, merged, merged_path


def _names(path) -> list[str]:
    return [event["name"] for event in range_events(path)]


def test_one_trace_per_rank(tp_run):
    results, _, _, _ = tp_run
    paths = [result["path"] for result in results]
    assert len(set(paths)) == TP
    for rank, path in enumerate(paths):
        assert path.endswith(f"rank{rank}.json")
        assert load_trace(path)["traceEvents"]


def test_traces_have_the_forward_and_backward_ranges(tp_run):
    results, _, _, _ = tp_run
    for result in results:
        names = _names(result["path"])
        for module in ("ln1", "attn", "ln2", "mlp"):
            for direction in ("forward", "backward"):
                assert names.count(f"{module} {direction}") == STEPS, (module, direction)


def test_all_reduce_ranges_are_exactly_commtracers(tp_run):
    results, _, _, _ = tp_run
    for result in results:
        # 2 forward + 2 backward per block per step
        assert result["all_reduces"] == 4 * STEPS
        assert result["collectives"] == {"all_reduce": 4 * STEPS}
        names = _names(result["path"])
        assert names.count("all_reduce") == result["all_reduces"]
        assert [n for n in names if range_kind(n) == "comm"] == ["all_reduce"] * (4 * STEPS)


def test_merged_trace_has_one_process_per_rank(tp_run, tmp_path):
    results, _, merged, merged_path = tp_run
    assert json.loads(merged_path.read_text()) == merged
    events = merged["traceEvents"]
    assert {event["pid"] for event in events} == set(range(TP))
    names = {event["pid"]: event["args"]["name"] for event in events
             if event.get("ph") == "M" and event["name"] == "process_name"}
    assert names == {rank: f"rank {rank}" for rank in range(TP)}
    for rank, result in enumerate(results):
        own = sorted(e["name"] for e in range_events(result["path"]))
        assert sorted(e["name"] for e in range_events(merged) if e["pid"] == rank) == own


def test_summary_splits_compute_and_the_all_reduce_time(tp_run):
    _, _, merged, _ = tp_run
    table = summarize(merged)
    assert [row.rank for row in table] == list(range(TP))
    for row in table:
        assert row.compute_s > 0 and row.comm_s > 0 and row.wait_s == 0
        assert row.comm_calls == {"all_reduce": 4 * STEPS}
        all_reduces = [e for e in range_events(merged)
                       if e["pid"] == row.rank and e["name"] == "all_reduce"]
        assert row.comm_s == pytest.approx(sum(e["dur"] for e in all_reduces) * 1e-6, rel=1e-6)
        assert 0 < row.comm_fraction < 1
    text = str(table)
    assert "compute (ms)" in text and "all_reduce x8" in text


def test_profiling_off_records_no_ranges(tp_run):
    _, off, _, _ = tp_run
    for result in off:
        assert result["all_reduces"] == 4 * STEPS  # the same step, only not instrumented
        assert _names(result["path"]) == []
        assert summarize(result["path"]) == []


def _hook_count(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_pre_hooks)
               + len(m._backward_hooks) for m in model.modules())


@pytest.mark.parametrize("enabled", [True, False])
def test_nothing_left_behind(enabled):
    block = Block(ModelConfig(hidden=16, heads=2, seq_len=8))
    originals = {op: getattr(dist, op) for op in COMM_OPS}
    x = torch.randn(2, 8, 16, requires_grad=True)
    with profile() as prof:
        with profiled(block, enabled=enabled, stage=1, microbatch=0) as context:
            assert (getattr(dist, "all_reduce") is not originals["all_reduce"]) == enabled
            assert (_hook_count(block) > 0) == enabled
            block(x).sum().backward()
        block(x).sum().backward()  # after the context: not recorded
    assert _hook_count(block) == 0 and not context._handles
    assert all(getattr(dist, op) is original for op, original in originals.items())
    names = sorted(event.name for event in prof.events() if range_kind(event.name))
    expected = sorted(f"stage 1 mb 0 {module} {direction}" for module in ("ln1", "attn", "ln2", "mlp")
                      for direction in ("forward", "backward"))
    assert names == (expected if enabled else [])


def test_an_exception_inside_restores_everything():
    block = Block(ModelConfig(hidden=16, heads=2, seq_len=8))
    original = dist.all_reduce
    with pytest.raises(RuntimeError, match="boom"):
        with profiled(block):
            block(torch.randn(1, 8, 16))
            raise RuntimeError("boom")
    assert dist.all_reduce is original and _hook_count(block) == 0


def test_summary_counts_nested_ranges_once_and_subtracts_comm():
    def event(name, ts, dur, pid=0):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur,
                "pid": pid}
    events = [event("block forward", 0, 10), event("attn forward", 2, 6),
              event("all_reduce", 3, 2), event("gloo:all_reduce", 3, 2),
              event("irecv wait", 20, 4), event("aten::mm", 1, 1)]
    (row,) = summarize(events)
    assert row.compute_s == pytest.approx(8e-6)
    assert row.comm_s == pytest.approx(6e-6) and row.wait_s == pytest.approx(4e-6)
    assert row.comm_calls == {"all_reduce": 1, "irecv wait": 1}


def test_range_kind():
    assert range_kind("all_reduce") == range_kind("stage 0 isend wait") == "comm"
    assert range_kind("stage 1 mb 2 attn backward") == "compute"
    assert range_kind("gloo:all_reduce") is None and range_kind("aten::mm") is None


# ------------------------------------------------ async collectives: their time in flight

def test_the_profilers_clock_is_unix_time_from_the_traces_base(tmp_path):
    """rank_trace writes in-flight times as (time.time_ns() - baseTimeNanoseconds) / 1000:
    a range opened between two time_ns() readings must start between them."""
    import time
    from torch.profiler import record_function
    from reference_impl.perf.traces import rank_trace
    marks = []
    with rank_trace(str(tmp_path), rank=0):
        for i in range(20):
            before = time.time_ns()
            with record_function(f"probe{i} forward"):
                inside = time.time_ns()
                sum(range(2000))
                inside_end = time.time_ns()
            marks.append((before, inside, inside_end, time.time_ns()))
    trace = load_trace(tmp_path / "rank0.json")
    base = trace.get("baseTimeNanoseconds", 0)
    probes = {event["name"]: event for event in range_events(trace)}
    slack = 1000  # ns: ts is written in microseconds with 3 decimals, stored as a double
    for i, (before, inside, inside_end, after) in enumerate(marks):
        event = probes[f"probe{i} forward"]
        start = event["ts"] * 1e3 + base
        end = start + event["dur"] * 1e3
        assert before - slack <= start <= inside + slack, (i, start - before, inside - start)
        assert inside_end - slack <= end <= after + slack, (i, end - inside_end, after - end)


def test_in_flight_rows_nest():
    from reference_impl.perf.ranges import IN_FLIGHT_TID, InFlight
    from reference_impl.perf.traces import in_flight_events
    records = [InFlight("all_reduce in flight", start) for start in (1000, 1500, 3000, 9000)]
    for record, end in zip(records, (2000, 4000, 3500, 9500)):
        record.end_ns = end
    records.append(InFlight("all_reduce in flight", 5000))  # never completed: left out
    events = in_flight_events(records, base_ns=1000, pid=3)
    ranges = [(e["tid"] - IN_FLIGHT_TID, e["ts"], e["dur"]) for e in events if e["ph"] == "X"]
    # 1500-4000 overlaps 1000-2000: second row; 3000-3500 fits on the first after 2000
    assert ranges == [(0, 0.0, 1.0), (1, 0.5, 2.5), (0, 2.0, 0.5), (0, 8.0, 0.5)]
    names = {e["tid"] - IN_FLIGHT_TID: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {0: "collectives in flight", 1: "collectives in flight 2"}
    assert all(e["pid"] == 3 for e in events)
    assert all(range_kind(e["name"]) == "comm" for e in events if e["ph"] == "X")


def _async_all_reduce_inside_compute(out_dir):
    from reference_impl.perf.traces import rank_trace

    class Overlapping(torch.nn.Module):
        def forward(self, x):
            handle = dist.all_reduce(torch.ones(1 << 16), async_op=True)
            for _ in range(20):
                x = torch.tanh(x @ x)
            handle.wait()
            dist.all_reduce(torch.ones(4))  # blocking: no time in flight of its own
            return x

    model = Overlapping()
    with rank_trace(out_dir) as profiler, profiled(model, modules={"overlapping": model}):
        model(torch.randn(128, 128) / 16)
    return profiler.path


def test_an_async_collective_gets_its_time_in_flight_on_its_own_row(tmp_path):
    from reference_impl.perf.ranges import IN_FLIGHT_TID
    paths = launch(_async_all_reduce_inside_compute, 2, str(tmp_path), backend="gloo")
    merged = merge_traces(paths)
    for rank in range(2):
        events = {}
        for event in range_events(merged):
            if event["pid"] == rank:
                events.setdefault(event["name"], []).append(event)
        assert sorted((name, len(found)) for name, found in events.items()) == [
            ("all_reduce", 2), ("all_reduce in flight", 1), ("all_reduce wait", 1),
            ("overlapping forward", 1)], events
        (compute,), (flight,), (wait,) = (events[name] for name in (
            "overlapping forward", "all_reduce in flight", "all_reduce wait"))
        launch_range = min(events["all_reduce"], key=lambda e: e["ts"])
        assert flight["tid"] == IN_FLIGHT_TID and compute["tid"] != IN_FLIGHT_TID
        slack = 1.0  # us
        # as in real time: launched inside the launch's range, inside the module's forward,
        # completed before the wait returned, inside the forward
        assert launch_range["ts"] - slack <= flight["ts"] <= (
            launch_range["ts"] + launch_range["dur"] + slack)
        assert compute["ts"] <= flight["ts"]
        assert flight["ts"] + flight["dur"] <= wait["ts"] + wait["dur"] + slack
        assert wait["ts"] + wait["dur"] <= compute["ts"] + compute["dur"]
        (row,) = [row for row in summarize(merged) if row.rank == rank]
        # the forward computes while its all-reduce is in flight: only the calls and the wait
        # on its own thread are taken from its compute
        on_thread = [e for name in ("all_reduce", "all_reduce wait") for e in events[name]]
        # (to 10 ns: a trace stores each ts and dur rounded to the nanosecond on its own)
        assert row.compute_s == pytest.approx(
            (compute["dur"] - sum(e["dur"] for e in on_thread)) * 1e-6, abs=1e-8)


def test_summary_subtracts_only_the_same_threads_communication():
    events = [{"ph": "X", "cat": "user_annotation", "name": "mlp backward", "ts": 0, "dur": 10,
               "pid": 0, "tid": 1},
              {"ph": "X", "cat": "user_annotation", "name": "all_reduce in flight", "ts": 5,
               "dur": 10, "pid": 0, "tid": 2}]
    (row,) = summarize(events)
    assert row.compute_s == pytest.approx(10e-6) and row.comm_s == pytest.approx(10e-6)
