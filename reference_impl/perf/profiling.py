"""Named ranges around modules and collectives, per-rank traces, one merged timeline, a summary.

    with torch.profiler.profile() as prof, profiled(block):
        block(x).backward(upstream)
    prof.export_chrome_trace(f"rank{rank}.json")          # or: with rank_trace(out_dir): ...
                                                          # (async collectives' time in flight:
                                                          # rank_trace only)
    merge_traces([...], "merged.json"); print(summarize("merged.json"))

The diagnostic drill of the course notes "Week 15 - Tensor Parallelism and Pipeline Parallelism":
*see the timeline of all-reduce vs compute; tensor parallelism's
signature is short, frequent all-reduces.* :func:`profiled` puts a named range

* around the forward and the backward of chosen modules ("attn forward", "mlp backward"):
  forward pre/post hooks, and full backward pre/post hooks (the backward range opens when the
  gradient of the module's output is ready and closes when that of its input is computed);
* around every collective and point-to-point call ("all_reduce", "isend", ...), by wrapping
  the ``torch.distributed`` functions of ``comm_trace``'s table while active, as
  ``CommTracer`` does (the two nest, in either order). ``isend``/``irecv`` and
  ``batch_isend_irecv`` (the pipeline executor posts each step's send and receive together)
  return their work wrapped, so that its ``wait()`` gets a range too ("batch_isend_irecv
  wait"): that is where a pipeline stage sits idle, waiting for its neighbour;
* around the **time in flight of an asynchronous collective** (``async_op=True``: DDP's
  bucketed all-reduces, ZeRO's reduce-scatters and all-gathers). Such a call returns at once,
  so its range on the calling thread ("all_reduce") times only the launch; the collective then
  runs on gloo's own thread. :func:`profiled` records (name, launch, completion) and
  :func:`rank_trace` adds it to the rank's trace as a range "all_reduce in flight" on a row of
  its own, the pseudo-thread "collectives in flight" (tid :data:`IN_FLIGHT_TID`; a second
  row, ``IN_FLIGHT_TID + 1``, and so on, only where collectives are in flight at once, since
  a row's ranges must nest): what HTA sees as an NCCL kernel on its own stream beside the
  compute stream. The launch is timed inside the call's range, just before the call; the
  completion in a callback of ``work.get_future()``, which gloo runs on its own thread as
  soon as the collective is done, or when its ``wait()`` returns if that comes first (the
  callback can run late where gloo's thread waits for a core; a work without a future: at
  its ``wait()``, which can be later than the completion). The work's ``wait()`` gets a range
  on the calling thread ("all_reduce wait"). So the in-flight range beside compute ranges is
  the overlapped communication, and the rest of it, where the rank computes nothing
  (typically up to the end of the waits before the optimizer step), is the exposed
  communication. A collective
  completes on a rank only once every rank has joined it: time in flight includes waiting
  for a slower rank. On a GPU these are host-side times (launch to the completion the host
  learns of); the NCCL kernels in the same trace are the GPU's truth.

  The clocks: ``torch.profiler`` (torch 2.13, Kineto) converts its approximate clock to Unix
  time, and the exported ``ts`` (microseconds) is Unix time minus the trace's
  ``baseTimeNanoseconds``; so the in-flight times are taken with ``time.time_ns()`` (Unix
  time) and written as ``(ns - baseTimeNanoseconds) / 1000``. Checked against
  ``record_function`` ranges: a range opened between two ``time.time_ns()`` readings starts
  between them, to within the clock's resolution (``tests/test_profiling.py``);
  ``time.perf_counter_ns()`` has another origin and drifts from it by about a microsecond a
  second.

The ranges are ``torch.profiler.record_function`` ranges (they show up as ``user_annotation``
events in a ``torch.profiler.profile`` run, exported per rank as a Chrome/Perfetto JSON trace by
:func:`rank_trace`); on a GPU each is also an NVTX range (``torch.cuda.nvtx.range_push/pop``,
for Nsight Systems), opened and closed with it, so the same names reach both tools. Out of the
context, or with ``enabled=False``, nothing is left behind: every hook is removed and every
``torch.distributed`` function restored.

**On GPUs, with Nsight Systems.** Profile each rank under torchrun, capturing only the steps
between ``torch.cuda.profiler.start()`` and ``stop()`` (warm-up excluded)::

    nsys profile -o rank%q{RANK} --capture-range=cudaProfilerApi --capture-range-end=stop \\
        --trace=cuda,nvtx,osrt torchrun --nproc-per-node 4 my_script.py

    # my_script.py, on every rank:
    for step in range(warmup): train_step()
    torch.cuda.profiler.start()
    with profiled(model):
        for step in range(steps): train_step()
    torch.cuda.synchronize(); torch.cuda.profiler.stop()

(``%q{RANK}`` expands the environment variable, so each rank writes its own ``rankN.nsys-rep``;
open them together in the Nsight Systems GUI, "Add report to timeline".) What to look for:

* **TP**: on each GPU, the GEMM kernels of a block are interrupted by *short, frequent*
  ``ncclDevKernel_AllReduce`` kernels, 2 per block forward and 2 backward, each under an NVTX
  "all_reduce" range nested in "attn forward"/"mlp forward" (or backward); the GEMMs wait
  on them, so their total share of the step is TP's communication cost.
* **PP**: ``SendRecv`` kernels ("batch_isend_irecv" ranges) only at stage boundaries, one
  activation per microbatch forward and one gradient backward, and the **bubble**: the idle
  stretch at the start (before the first microbatch arrives, "batch_isend_irecv wait") and at the end of
  every stage but the first and the last.

On the CPU (gloo) the same picture comes from :func:`rank_trace`'s per-rank JSON traces:
:func:`merge_traces` puts them in one file, one process row per rank, to open in
https://ui.perfetto.dev or chrome://tracing, and :func:`summarize` tabulates time in
compute vs communication per rank. On a GPU the same works, the traces also holding the
kernels (and the profiler's GPU-side copies of the ranges, category ``gpu_user_annotation``);
:func:`summarize` reads the CPU-side ranges, i.e. the host's view: kernels and NCCL
collectives run asynchronously, so there a range times what the host launched and waited for,
Nsight Systems (or the GPU rows of the trace) the GPU's own work.

    python -m reference_impl.perf.profiling --tp 2 --steps 3 --out DIR

profiles a TP block on ``--tp`` CPU ranks (gloo; ``--backend nccl``: one GPU per rank) and
writes ``DIR/rank{r}.json``, ``DIR/merged.json`` and prints the summary.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import inspect
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.comm.comm_trace import _PAYLOAD_ARGUMENT
from reference_impl.comm.launcher import current_device, wait_for_device

#: the torch.distributed functions given a range: CommTracer's table (so both see the same calls)
COMM_OPS = tuple(_PAYLOAD_ARGUMENT) + ("batch_isend_irecv",)
_ASYNC_OPS = ("isend", "irecv", "batch_isend_irecv")
#: the collectives that take ``async_op``: called with ``async_op=True``, their time in flight
#: becomes a range on the "collectives in flight" row
ASYNC_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                     "reduce_scatter", "reduce_scatter_tensor")
WAIT_SUFFIX = " wait"
IN_FLIGHT_SUFFIX = " in flight"
IN_FLIGHT_THREAD = "collectives in flight"
IN_FLIGHT_TID = 1_000_000_000  # above any Linux thread id (pid_max is at most 2**22)
COMPUTE_SUFFIXES = (" forward", " backward")
RANGE_CATEGORY = "user_annotation"  # how record_function ranges appear in a torch.profiler trace
RANGE_KINDS = ("record_function", "nvtx", "both")  # what profiled(ranges=...) opens, besides "auto"


def range_kind(name: str) -> str | None:
    """"comm" for a collective/send/recv range (or the wait of one, or its time in flight),
    "compute" for a module's
    forward or backward range, None for anything else (the profiler's own ops)."""
    for suffix in (WAIT_SUFFIX, IN_FLIGHT_SUFFIX):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    if name.split(" ")[-1] in COMM_OPS:
        return "comm"
    if name.endswith(COMPUTE_SUFFIXES):
        return "compute"
    return None


# ------------------------------------------------------------------------------ the ranges

class _Ranges:
    """Open and close named ranges: record_function (torch.profiler), NVTX (Nsight Systems),
    or both at once ("both", what a GPU rank uses): the NVTX range is pushed first and popped
    last, so the two nest the same way."""

    def __init__(self, kind: str):
        if kind not in RANGE_KINDS:
            raise ValueError(f"ranges must be 'auto', 'record_function', 'nvtx' or 'both', "
                             f"got {kind!r}")
        self.kind = kind
        self.record = kind in ("record_function", "both")
        self.nvtx = kind in ("nvtx", "both")

    def open(self, name: str):
        if self.nvtx:
            torch.cuda.nvtx.range_push(name)
        return torch.ops.profiler._record_function_enter_new(name, None) if self.record else None

    def close(self, handle) -> None:
        if self.record:
            torch.ops.profiler._record_function_exit._RecordFunction(handle)
        if self.nvtx:
            torch.cuda.nvtx.range_pop()

    @contextlib.contextmanager
    def range(self, name: str):
        handle = self.open(name)
        try:
            yield
        finally:
            self.close(handle)


class _TimedWork:
    """The work of an isend/irecv or of an async collective, its ``wait()`` inside a range;
    everything else passed on. ``on_wait``: called when the wait returns, inside its range."""

    def __init__(self, work, name: str, ranges: _Ranges, on_wait=None):
        self._work, self._name, self._ranges, self._on_wait = work, name, ranges, on_wait

    def wait(self, *args, **kwargs):
        with self._ranges.range(self._name):
            result = self._work.wait(*args, **kwargs)
            if self._on_wait is not None:
                self._on_wait()
        return result

    def __getattr__(self, attribute):
        return getattr(self._work, attribute)


class InFlight:
    """One asynchronous collective: its name, launch and completion (``time.time_ns()``)."""

    __slots__ = ("name", "start_ns", "end_ns")

    def __init__(self, name: str, start_ns: int):
        self.name, self.start_ns, self.end_ns = name, start_ns, None

    def done(self, *_) -> None:
        """The future's callback: the collective is done (now, or a little earlier where the
        backend's thread waited for a core)."""
        if self.end_ns is None:
            self.end_ns = time.time_ns()

    def waited(self) -> None:
        """After ``wait()`` returned: done by now, whether or not the callback has run."""
        now = time.time_ns()
        if self.end_ns is None or self.end_ns > now:
            self.end_ns = now

    def __repr__(self) -> str:
        return f"InFlight({self.name!r}, {self.start_ns}, {self.end_ns})"


_in_flight_logs: list[list[InFlight]] = []  # one per open rank_trace, innermost last
_in_flight_lock = threading.Lock()


def _record_in_flight(op: str, work, start_ns: int):
    """Log an async collective's time in flight with every open :func:`rank_trace`; its
    completion comes from the work's future, or from its wait() if that returns first (or
    the work has no future). Returns the callback to run after wait()."""
    record = InFlight(op + IN_FLIGHT_SUFFIX, start_ns)
    with _in_flight_lock:
        for log in _in_flight_logs:
            log.append(record)
    try:
        future = work.get_future()
    except (AttributeError, RuntimeError):  # a backend whose works have no future
        return record.waited
    future.add_done_callback(record.done)  # runs on the backend's thread, once it is done
    return record.waited


def in_flight_events(records, base_ns: int = 0, pid: int = 0) -> list[dict]:
    """Trace events of completed :class:`InFlight` records on the profiler's clock (``ts`` in
    microseconds from ``base_ns``, the trace's ``baseTimeNanoseconds``): complete events on the
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


def default_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules given ranges unless told: the model's direct children ("ln1", "attn",
    "ln2", "mlp" of a block; "0", "1", ... of a pipeline Stage), or the model itself if it
    has none."""
    children = dict(model.named_children())
    return children or {type(model).__name__: model}


class profiled(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Named ranges around ``modules``' forward and backward and around every collective.

    ``modules``: {name: module} or names of ``model``'s submodules (default: its direct
    children, :func:`default_modules`). ``stage`` and ``microbatch`` label the module ranges
    ("stage 1 mb 0 attn forward"); ``microbatch="auto"`` numbers each module's forward (and
    backward) calls 0, 1, ... within the context, as a pipeline stage runs its microbatches.
    ``ranges``: "auto" ("both" when this rank computes on a GPU, else "record_function"),
    "record_function" (torch.profiler only), "nvtx" (Nsight Systems only) or "both".
    ``enabled=False``: nothing at all is installed.
    """

    def __init__(self, model: nn.Module, enabled: bool = True, stage: int | None = None,
                 microbatch: int | str | None = None, modules=None, ranges: str = "auto"):
        self.model, self.enabled = model, enabled
        self.stage, self.microbatch = stage, microbatch
        if modules is None:
            modules = default_modules(model)
        elif not isinstance(modules, dict):
            modules = {name: model.get_submodule(name) for name in modules}
        self.modules = modules
        if ranges == "auto":
            ranges = "both" if current_device().type == "cuda" else "record_function"
        self.ranges = _Ranges(ranges)
        self._handles, self._originals = [], {}
        self._open: dict[tuple[int, str], list] = {}
        self._calls: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()

    # -- labels
    def _label(self, name: str, direction: str, module: nn.Module) -> str:
        parts = []
        if self.stage is not None:
            parts.append(f"stage {self.stage}")
        if self.microbatch == "auto":
            key = (id(module), direction)
            with self._lock:
                index = self._calls.get(key, 0)
                self._calls[key] = index + 1
            parts.append(f"mb {index}")
        elif self.microbatch is not None:
            parts.append(f"mb {self.microbatch}")
        return " ".join(parts + [name, direction])

    def _start(self, name: str, direction: str, module: nn.Module) -> None:
        handle = self.ranges.open(self._label(name, direction, module))
        with self._lock:
            self._open.setdefault((id(module), direction), []).append(handle)

    def _stop(self, direction: str, module: nn.Module) -> None:
        with self._lock:
            stack = self._open.get((id(module), direction))
            if not stack:  # e.g. a backward hook without its pre-hook: nothing to close
                return
            handle = stack.pop()
        self.ranges.close(handle)

    # -- install / remove
    def __enter__(self) -> "profiled":
        if not self.enabled:
            return self
        for name, module in self.modules.items():
            self._handles += [
                module.register_forward_pre_hook(
                    lambda m, args, name=name: self._start(name, "forward", m)),
                module.register_forward_hook(
                    lambda m, args, output: self._stop("forward", m)),
                module.register_full_backward_pre_hook(
                    lambda m, grad_output, name=name: self._start(name, "backward", m)),
                module.register_full_backward_hook(
                    lambda m, grad_input, grad_output: self._stop("backward", m)),
            ]
        for op in COMM_OPS:
            original = getattr(dist, op)
            self._originals[op] = original
            setattr(dist, op, self._wrap(op, original))
        return self

    def __exit__(self, *exc_info) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for op, original in self._originals.items():
            setattr(dist, op, original)
        self._originals.clear()
        with self._lock:  # close what an exception left open, innermost first
            leftovers = [h for stack in self._open.values() for h in reversed(stack)]
            self._open.clear()
        for handle in leftovers:
            self.ranges.close(handle)

    def _wrap(self, op, original):
        ranges = self.ranges
        signature = (inspect.signature(getattr(dist.distributed_c10d, op))
                     if op in ASYNC_COLLECTIVES else None)

        def ranged(*args, **kwargs):
            is_async = False
            if signature is not None:
                try:
                    is_async = signature.bind(*args, **kwargs).arguments.get("async_op", False)
                except TypeError:  # wrong arguments: let the call itself raise
                    is_async = False
            with ranges.range(op):
                launched = time.time_ns() if is_async else None
                result = original(*args, **kwargs)
            if launched is not None and result is not None:
                on_wait = _record_in_flight(op, result, launched)
                return _TimedWork(result, op + WAIT_SUFFIX, ranges, on_wait)
            if op in _ASYNC_OPS and isinstance(result, list):  # batch_isend_irecv's works
                return [_TimedWork(work, op + WAIT_SUFFIX, ranges) for work in result]
            if op in _ASYNC_OPS and result is not None:
                return _TimedWork(result, op + WAIT_SUFFIX, ranges)
            return result
        ranged.__wrapped__ = original
        return ranged


# ------------------------------------------------------------------------- per-rank traces

@contextlib.contextmanager
def rank_trace(out_dir: str, rank: int | None = None, name: str = "rank{rank}.json"):
    """A ``torch.profiler.profile`` run on this rank, exported on exit as a Chrome/Perfetto
    trace ``out_dir/rank{rank}.json``: CPU activity always (the ranges are CPU events, on a GPU
    too), plus the CUDA kernels when this rank computes on a GPU and the profiler supports
    them, plus the time in flight of the async collectives :func:`profiled` saw meanwhile
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
    log: list[InFlight] = []
    with _native_stderr_silenced():  # Kineto logs "USDT: ... profiler_start" at start and stop
        profiler.__enter__()
    with _in_flight_lock:
        _in_flight_logs.append(log)
    try:
        profiler.path = path
        yield profiler
    finally:
        wait_for_device()  # the GPU's queued work belongs to the profiled stretch
        with _in_flight_lock:
            _in_flight_logs.remove(log)
        with _native_stderr_silenced():
            profiler.__exit__(None, None, None)
    profiler.export_chrome_trace(path)
    if log:
        trace = load_trace(path)
        trace.setdefault("traceEvents", []).extend(
            in_flight_events(log, trace.get("baseTimeNanoseconds", 0), os.getpid()))
        with open(path, "w") as handle:
            json.dump(trace, handle)


@contextlib.contextmanager
def _native_stderr_silenced():
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


# ---------------------------------------------------------------------------- the summary

def union_length(intervals) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def union(intervals) -> list[tuple[float, float]]:
    merged = []
    for start, stop in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def overlap(a, b) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def difference(a, b) -> list[tuple[float, float]]:
    """The parts of the sorted, disjoint intervals ``a`` outside the sorted, disjoint ``b``."""
    left = []
    for start, end in a:
        for cut_start, cut_end in b:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                left.append((start, cut_start))
            start = max(start, cut_end)
        if start < end:
            left.append((start, end))
    return left


@dataclass(frozen=True)
class RankSummary:
    rank: int
    compute_s: float   # the forward/backward ranges (their union) minus the comm inside them
    #                    on the same thread
    comm_s: float      # the collective/send/recv ranges (their union)
    wait_s: float      # of which in a wait(): a pipeline stage idle (bubble), or a step
    #                    waiting for its async collectives
    comm_calls: dict   # range name -> how many
    comm_fraction: float  # comm / (compute + comm)


class SummaryTable(list):
    """A list of :class:`RankSummary`, one per rank; prints as a table."""

    def __str__(self) -> str:
        lines = [f"{'rank':>4}  {'compute (ms)':>12}  {'comm (ms)':>9}  {'of which wait':>13}  "
                 f"{'comm share':>10}  comm calls"]
        for row in self:
            calls = ", ".join(f"{name} x{count}" for name, count in sorted(row.comm_calls.items()))
            lines.append(f"{row.rank:>4}  {1e3 * row.compute_s:>12.2f}  {1e3 * row.comm_s:>9.2f}"
                         f"  {1e3 * row.wait_s:>13.2f}  {row.comm_fraction:>10.0%}  {calls}")
        return "\n".join(lines)

    _repr_pretty_ = lambda self, printer, cycle: printer.text(str(self))  # noqa: E731


def range_events(trace) -> list[dict]:
    """The complete ("X") events of :func:`profiled`'s ranges in a trace (CPU side: the
    ``user_annotation`` category, so the GPU copies of the same ranges are not counted twice)."""
    return [event for event in load_trace(trace).get("traceEvents", [])
            if event.get("ph") == "X" and event.get("cat", RANGE_CATEGORY) == RANGE_CATEGORY
            and range_kind(event.get("name", "")) is not None]


def summarize(trace) -> SummaryTable:
    """Time in compute vs communication per rank (process) of a trace (a merged one, or one
    rank's; a path, dict or list of events). Communication: the union of the collective and
    send/recv ranges (the time in flight of async collectives included); compute: the union of
    the forward/backward ranges minus the communication inside them on the same thread (a
    thread in a blocking collective waits; a collective in flight on another row does not stop
    it; nested module ranges are counted once)."""
    per_rank: dict = {}  # pid -> tid -> {"comm": intervals, "compute": intervals}
    waits: dict = {}
    calls: dict[int, dict[str, int]] = {}
    for event in range_events(trace):
        pid = event.get("pid", 0)
        kind = range_kind(event["name"])
        start = float(event["ts"]) * 1e-6
        interval = (start, start + float(event.get("dur", 0)) * 1e-6)
        per_rank.setdefault(pid, {}).setdefault(event.get("tid", 0),
                                                {"comm": [], "compute": []})[kind].append(interval)
        if event["name"].endswith(WAIT_SUFFIX):
            waits.setdefault(pid, []).append(interval)
        if kind == "comm":
            counter = calls.setdefault(pid, {})
            counter[event["name"]] = counter.get(event["name"], 0) + 1
    table = SummaryTable()
    for index, pid in enumerate(sorted(per_rank, key=lambda p: (not isinstance(p, int), p))):
        threads = per_rank[pid].values()
        comm = union([interval for ranges in threads for interval in ranges["comm"]])
        comm_s = union_length(comm)
        compute_s = union_length([interval for ranges in threads for interval in difference(
            union(ranges["compute"]), union(ranges["comm"]))])
        rank = pid if isinstance(pid, int) and len(per_rank) > 1 else index
        total = comm_s + compute_s
        wait_s = union_length(waits.get(pid, []))
        table.append(RankSummary(rank, compute_s, comm_s, wait_s, calls.get(pid, {}),
                                 comm_s / total if total else 0.0))
    return table


# ----------------------------------------------------------------------- the TP-block demo

def profile_tp_block_on_rank(out_dir: str, steps: int = 3, hidden: int = 64, heads: int = 4,
                             seq: int = 32, batch: int = 2, enabled: bool = True) -> dict:
    """Run on every rank of a launch: ``steps`` forward + backward steps of a ``ParallelBlock``
    (after one warm-up step) under :func:`profiled` and :func:`rank_trace`; returns the trace's
    path and the all-reduces ``CommTracer`` counted meanwhile."""
    from reference_impl.comm.comm_trace import CommTracer
    from reference_impl.model import Block, ModelConfig
    from reference_impl.tp.tp_attention import ParallelBlock

    device = current_device()
    torch.manual_seed(0)
    block = ParallelBlock(Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device))
    x = torch.randn(batch, seq, hidden).to(device).requires_grad_()
    upstream = torch.randn(batch, seq, hidden).to(device)
    block(x).backward(upstream)  # warm-up
    with rank_trace(out_dir) as profiler, CommTracer() as tracer, \
            profiled(block, enabled=enabled):
        for _ in range(steps):
            block.zero_grad(set_to_none=True)
            block(x).backward(upstream)
        wait_for_device()
    return {"path": profiler.path, "all_reduces": tracer.count("all_reduce"),
            "collectives": tracer.summary()}


def profile_ddp_on_rank(out_dir: str, bucket_bytes: int, steps: int = 3, width: int = 512,
                        layers: int = 6, batch: int = 256, name: str = "rank{rank}.json") -> dict:
    """Run on every rank of a launch: ``steps`` training steps (after one warm-up step) of an
    MLP of ``layers`` ``Linear(width, width) + ReLU`` layers ("layer0", ...) wrapped in lab 5's
    ``OverlappingDataParallel`` with ``bucket_bytes`` per bucket, under :func:`profiled` and
    :func:`rank_trace`. The layers' backward ranges are the compute the buckets' all-reduces
    can hide behind; their time in flight is on the "collectives in flight" row. A bucket of
    ``(width + 1) * width * 4`` bytes holds one layer (its all-reduce starts as soon as that
    layer's gradients are ready, inside the backward); one of ``2**40`` every gradient (its
    all-reduce starts at the end of the backward). Returns the trace's path and the number of
    buckets."""
    from collections import OrderedDict

    from reference_impl.hybrid.ddp_hooks import OverlappingDataParallel

    device = current_device()
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        (f"layer{i}", nn.Sequential(nn.Linear(width, width), nn.ReLU())) for i in range(layers)))
    model.to(device)
    ddp = OverlappingDataParallel(model, bucket_bytes=bucket_bytes)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1 + dist.get_rank())  # each rank its own samples
    x = torch.randn(batch, width, generator=generator).to(device).requires_grad_()  # so that
    target = torch.randn(batch, width, generator=generator).to(device)  # layer0's backward
    #                                                        range closes after it

    def step():
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), target).backward()
        ddp.finish_gradient_sync()
        optimizer.step()

    step()  # warm-up
    with rank_trace(out_dir, name=name) as profiler, profiled(model):
        for _ in range(steps):
            step()
        wait_for_device()
    ddp.remove_hooks()
    return {"path": profiler.path, "buckets": len(ddp.buckets)}


def main(argv: list[str] | None = None) -> None:
    from reference_impl.comm.launcher import launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="profile")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--backend", default="gloo", choices=("auto", "gloo", "nccl"))
    args = parser.parse_args(argv)

    out_dir = os.path.abspath(args.out)
    results = launch(profile_tp_block_on_rank, args.tp, out_dir, args.steps, args.hidden,
                     args.heads, args.seq, args.batch, backend=args.backend, timeout=300.0)
    paths = [result["path"] for result in results]
    merged_path = os.path.join(out_dir, "merged.json")
    merge_traces(paths, merged_path)
    print(f"TP block on {args.tp} ranks, hidden {args.hidden}, heads {args.heads}, seq "
          f"{args.seq}, batch {args.batch}; {args.steps} profiled steps")
    for rank, path in enumerate(paths):
        print(f"rank {rank}: {path} ({results[rank]['all_reduces']} all-reduces by CommTracer)")
    print(f"merged: {merged_path}  (open in https://ui.perfetto.dev or chrome://tracing)\n")
    print(summarize(merged_path))


if __name__ == "__main__":
    main()
