"""Per-rank traces: recorded, read back, merged into one timeline.

    with rank_trace(out_dir):                     # writes out_dir/rank{r}.json on each rank
        ...                                       # profiled steps
    merge_traces([...], "merged.json")            # one process row per rank (Perfetto)
    ranges_by_rank("merged.json")                 # {rank: {thread: {"compute": ..., "comm": ...}}}

:func:`rank_trace` exports a ``torch.profiler`` run as a Chrome/Perfetto JSON trace, with the
time in flight of asynchronous collectives on rows of their own (:func:`in_flight_events`);
:func:`merge_traces` puts the ranks' traces in one file; :func:`range_events` and
:func:`ranges_by_rank` read the ranges of :func:`reference_impl.perf.ranges.profiled` back.
The clocks, the rows and what to look for: ``docs/profiling.md``.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
from collections.abc import Iterable

import torch.distributed as dist

from reference_impl.comm.device import current_device, wait_for_device
from reference_impl.perf.intervals import Intervals
from reference_impl.perf.ranges import (IN_FLIGHT_THREAD, IN_FLIGHT_TID, RANGE_CATEGORY,
                                        close_in_flight_log, open_in_flight_log, range_kind)


@contextlib.contextmanager
def rank_trace(out_dir: str, rank: int | None = None, name: str = "rank{rank}.json"):
    """A ``torch.profiler.profile`` run on this rank, exported on exit as a Chrome/Perfetto
    trace ``out_dir/rank{rank}.json``: CPU activity always (the ranges are CPU events, on a GPU
    too), plus the CUDA kernels when this rank computes on a GPU and the profiler supports
    them, plus the time in flight of the async collectives ``profiled`` saw meanwhile
    (:func:`in_flight_events`; those not completed by the end are left out). Yields the
    profiler; its ``path`` attribute is the file written."""
    from torch.profiler import ProfilerActivity, profile, supported_activities

    rank = dist.get_rank() if rank is None and dist.is_initialized() else (rank or 0)
    activities = [ProfilerActivity.CPU]
    if current_device().type == "cuda" and ProfilerActivity.CUDA in supported_activities():
        activities.append(ProfilerActivity.CUDA)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name.format(rank=rank))
    profiler = profile(activities=activities)
    with native_stderr_silenced():  # Kineto logs "USDT: ... profiler_start" at start and stop
        profiler.__enter__()
    log = open_in_flight_log()
    try:
        profiler.path = path
        yield profiler
    finally:
        wait_for_device()  # the GPU's queued work belongs to the profiled stretch
        close_in_flight_log(log)
        with native_stderr_silenced():
            profiler.__exit__(None, None, None)
    profiler.export_chrome_trace(path)
    if log:
        trace = load_trace(path)
        trace.setdefault("traceEvents", []).extend(
            in_flight_events(log, trace.get("baseTimeNanoseconds", 0), os.getpid()))
        with open(path, "w") as handle:
            json.dump(trace, handle)


@contextlib.contextmanager
def native_stderr_silenced():
    """Send file descriptor 2 (where C++ libraries log) to /dev/null while open."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def load_trace(trace) -> dict:
    """A Chrome trace as a dict: from a path (.json or .json.gz), a dict, or a list of events."""
    if isinstance(trace, (str, os.PathLike)):
        opener = gzip.open if str(trace).endswith(".gz") else open
        with opener(trace, "rt") as handle:
            return json.load(handle)
    if isinstance(trace, dict):
        return trace
    return {"traceEvents": list(trace)}


def merge_traces(paths: Iterable, out_path: str | None = None) -> dict:
    """One timeline from per-rank traces, given in rank order: every event of trace r moves to
    process r (its ``pid`` rewritten, names kept), named "rank r" and sorted by rank. The
    ranks' clocks are the same machine's (or synchronised nodes'), so timestamps are kept.
    Written to ``out_path`` if given; returned as a dict."""
    events = []
    traces = [load_trace(path) for path in paths]
    bases = [trace.get("baseTimeNanoseconds", 0) for trace in traces]
    for rank, trace in enumerate(traces):
        shift = (bases[rank] - min(bases)) / 1e3  # to the earliest base, in microseconds
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "M" and event.get("name") in ("process_name",
                                                                 "process_sort_index",
                                                                 "process_labels"):
                continue  # replaced below
            event = dict(event, pid=rank)
            if shift and "ts" in event:
                event["ts"] = event["ts"] + shift
            if event.get("ph") in ("s", "t", "f") and "id" in event:
                event["id"] = f"{rank}:{event['id']}"  # flow arrows stay within their rank
            events.append(event)
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    merged = {"traceEvents": events, "displayTimeUnit": "ms"}
    if out_path is not None:
        with open(out_path, "w") as handle:
            json.dump(merged, handle)
    return merged



def in_flight_events(records, base_ns: int = 0, pid: int = 0) -> list[dict]:
    """Trace events of completed :class:`~reference_impl.perf.ranges.InFlight` records on the
    profiler's clock (``ts`` in microseconds from ``base_ns``, the trace's
    ``baseTimeNanoseconds``): complete events on the
    "collectives in flight" row(s) of process ``pid``, plus the rows' names. A record goes on
    the first row whose last range ended before it started (rows must nest)."""
    rows: list[int] = []  # each row's last end
    events = []
    for record in sorted((r for r in records if r.end_ns is not None),
                         key=lambda r: (r.start_ns, r.end_ns)):
        row = next((i for i, end in enumerate(rows) if end <= record.start_ns), len(rows))
        if row == len(rows):
            rows.append(record.end_ns)
        rows[row] = record.end_ns
        events.append({"ph": "X", "cat": RANGE_CATEGORY, "name": record.name, "pid": pid,
                       "tid": IN_FLIGHT_TID + row,
                       "ts": round((record.start_ns - base_ns) / 1e3, 3),
                       "dur": round((record.end_ns - record.start_ns) / 1e3, 3),
                       "args": {"launch_to_completion": True}})
    for row in range(len(rows)):
        name = IN_FLIGHT_THREAD + (f" {row + 1}" if row else "")
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": IN_FLIGHT_TID + row,
                       "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid,
                       "tid": IN_FLIGHT_TID + row, "args": {"sort_index": IN_FLIGHT_TID + row}})
    return events


def range_events(trace) -> list[dict]:
    """The complete ("X") events of ``profiled``'s ranges in a trace (CPU side: the
    ``user_annotation`` category, so the GPU copies of the same ranges are not counted twice)."""
    return [event for event in load_trace(trace).get("traceEvents", [])
            if event.get("ph") == "X" and event.get("cat", RANGE_CATEGORY) == RANGE_CATEGORY
            and range_kind(event.get("name", "")) is not None]



def event_interval(event: dict) -> tuple[float, float]:
    """A complete event's (start, end) in seconds (``ts`` and ``dur`` are microseconds)."""
    start = float(event["ts"]) * 1e-6
    return start, start + float(event.get("dur", 0)) * 1e-6


def ranges_by_rank(trace) -> dict[int, dict[int, dict[str, Intervals]]]:
    """{rank: {thread: {"compute": intervals, "comm": intervals}}} of a trace (a path, a dict
    or a list of events), in seconds: the ranges of :func:`range_events`, by process (``pid``)
    and thread (``tid``)."""
    found: dict = {}
    for event in range_events(trace):
        thread = found.setdefault(event.get("pid", 0), {}).setdefault(
            event.get("tid", 0), {"compute": [], "comm": []})
        thread[range_kind(event["name"])].append(event_interval(event))
    return found
