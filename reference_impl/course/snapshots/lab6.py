"""Lab 6's expected values: the reference's reading of two recorded real traces.

``tests/labs/data/lab6_traces.json`` holds the range events of two runs on 2 CPU ranks:
lab 5's ``OverlappingDataParallel`` with one layer per bucket (merged, its all-reduces in
flight during the backward), and a TP block's per-rank traces as each rank wrote them.

* ``ddp``: {rank: {quantity: seconds}}, the reference's ``breakdown`` of the DDP trace;
  ``ddp_mistakes``: {rank: {mistake: {quantity: seconds}}}, what each headline mistake would
  give instead (so that a wrong number can be named);
* ``tp_skews/<set>``: {rank: seconds added to that rank's timestamps}, and
  ``tp_offsets/<set>``, ``tp_waits/<set>``, ``tp_straggler/<set>``: the reference's clock
  offsets of the per-rank TP traces so skewed, the waits read from their aligned timeline, and
  its straggler (the "hidden" set from :func:`make_hidden`).
"""
from __future__ import annotations

import json

from reference_impl.course.snapshots import REPO
from reference_impl.perf import trace_analysis
from reference_impl.perf.intervals import difference, overlap, union, union_length
from reference_impl.perf.traces import ranges_by_rank

TRACES = REPO / "tests" / "labs" / "data" / "lab6_traces.json"
SKEWS = {"public": {0: 0.0, 1: 2.5}, "hidden": {0: -0.75, 1: 40.0}}


def recorded() -> dict:
    return json.loads(TRACES.read_text())


def skewed(per_rank: dict, skews: dict) -> dict:
    """{rank: its trace with ``skews[rank]`` seconds added to every timestamp}."""
    return {rank: {"traceEvents": [dict(event, ts=event["ts"] + skews[rank] * 1e6)
                                   for event in per_rank[str(rank)]["traceEvents"]]}
            for rank in skews}


def mistakes(events) -> dict:
    """Per rank, what the headline mistakes give on a trace."""
    found = {}
    for pid, by_thread in sorted(ranges_by_rank(events).items()):
        comm = union([i for t in by_thread.values() for i in t["comm"]])
        compute = union([i for t in by_thread.values()
                         for i in difference(union(t["compute"]), union(t["comm"]))])
        every_compute = union([i for t in by_thread.values() for i in t["compute"]])
        in_flight = union([i for t in by_thread.values() for i in t["comm"] if not t["compute"]])
        on_compute_threads = union([i for t in by_thread.values() if t["compute"]
                                    for i in t["comm"]])
        comm_s, overlapped_s = union_length(comm), overlap(compute, comm)
        summed = sum(union_length(t["comm"]) for t in by_thread.values())
        found[pid] = {
            "in flight as compute": dict(comm_s=union_length(on_compute_threads),
                                         compute_s=union_length(union(compute + in_flight))),
            "other threads subtracted": dict(
                compute_s=union_length(every_compute) - overlap(every_compute, comm),
                overlapped_s=0.0),
            "overlapped as exposed": dict(overlapped_s=0.0, exposed_comm_s=comm_s),
            "comm summed over threads": dict(comm_s=summed, exposed_comm_s=summed - overlapped_s),
        }
    return found


def make() -> dict:
    traces = recorded()
    ddp = traces["ddp_small_buckets"]
    return {"ddp": {rank.rank: {name: getattr(rank, name) for name in (
                "compute_s", "comm_s", "overlapped_s", "exposed_comm_s", "idle_s", "span_s")}
                    for rank in trace_analysis.breakdown(ddp)},
            "ddp_mistakes": mistakes(ddp), **tp_reading("public", traces)}


def make_hidden() -> dict:
    return tp_reading("hidden", recorded())


def tp_reading(name: str, traces: dict) -> dict:
    """The reference's reading of the TP traces skewed by ``SKEWS[name]``."""
    per_rank = skewed(traces["tp_block_per_rank"], SKEWS[name])
    waits = trace_analysis.arrival_waits(trace_analysis.aligned_timeline(per_rank))
    return {f"tp_skews/{name}": SKEWS[name],
            f"tp_offsets/{name}": trace_analysis.clock_offsets(per_rank),
            f"tp_waits/{name}": waits, f"tp_straggler/{name}": trace_analysis.straggler(waits)}
