"""Profiling (``reference_impl.perf.profiling``): named ranges, per-rank traces, merge, summary.

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
from reference_impl.perf.profiling import (COMM_OPS, load_trace, merge_traces, profile_tp_block_on_rank,
                                      profiled, range_events, range_kind, summarize)

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
