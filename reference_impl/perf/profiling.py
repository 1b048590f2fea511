"""Named ranges around modules and collectives, per-rank traces, one merged timeline, a summary.

    with torch.profiler.profile() as prof, profiled(block):
        block(x).backward(upstream)
    prof.export_chrome_trace(f"rank{rank}.json")          # or: with rank_trace(out_dir): ...
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
  wait"): that is where a pipeline stage sits idle, waiting for its neighbour.

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
import sys
import threading
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
WAIT_SUFFIX = " wait"
COMPUTE_SUFFIXES = (" forward", " backward")
RANGE_CATEGORY = "user_annotation"  # how record_function ranges appear in a torch.profiler trace
RANGE_KINDS = ("record_function", "nvtx", "both")  # what profiled(ranges=...) opens, besides "auto"


def range_kind(name: str) -> str | None:
    """"comm" for a collective/send/recv range (or the wait of one), "compute" for a module's
    forward or backward range, None for anything else (the profiler's own ops)."""
    if name.endswith(WAIT_SUFFIX):
        name = name[:-len(WAIT_SUFFIX)]
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
    """The work of an isend/irecv, its ``wait()`` inside a range; everything else passed on."""

    def __init__(self, work, name: str, ranges: _Ranges):
        self._work, self._name, self._ranges = work, name, ranges

    def wait(self, *args, **kwargs):
        with self._ranges.range(self._name):
            return self._work.wait(*args, **kwargs)

    def __getattr__(self, attribute):
        return getattr(self._work, attribute)


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

        def ranged(*args, **kwargs):
            with ranges.range(op):
                result = original(*args, **kwargs)
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
    them. Yields the profiler; its ``path`` attribute is the file written."""
    from torch.profiler import ProfilerActivity, profile, supported_activities

    rank = dist.get_rank() if rank is None and dist.is_initialized() else (rank or 0)
    activities = [ProfilerActivity.CPU]
    if current_device().type == "cuda" and ProfilerActivity.CUDA in supported_activities():
        activities.append(ProfilerActivity.CUDA)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name.format(rank=rank))
    profiler = profile(activities=activities)
    with _native_stderr_silenced():  # Kineto logs "USDT: ... profiler_start" at start and stop
        profiler.__enter__()
    try:
        profiler.path = path
        yield profiler
    finally:
        wait_for_device()  # the GPU's queued work belongs to the profiled stretch
        with _native_stderr_silenced():
            profiler.__exit__(None, None, None)
    profiler.export_chrome_trace(path)


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


@dataclass(frozen=True)
class RankSummary:
    rank: int
    compute_s: float   # the forward/backward ranges (their union) minus the comm inside them
    comm_s: float      # the collective/send/recv ranges (their union)
    wait_s: float      # of which in an isend/irecv's wait(): a pipeline stage idle (bubble)
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
    send/recv ranges; compute: the union of the forward/backward ranges minus the
    communication inside them (nested module ranges are counted once)."""
    per_rank: dict[int, dict[str, list]] = {}
    calls: dict[int, dict[str, int]] = {}
    for event in range_events(trace):
        pid = event.get("pid", 0)
        kind = range_kind(event["name"])
        start = float(event["ts"]) * 1e-6
        interval = (start, start + float(event.get("dur", 0)) * 1e-6)
        per_rank.setdefault(pid, {"comm": [], "compute": [], "wait": []})[kind].append(interval)
        if event["name"].endswith(WAIT_SUFFIX):
            per_rank[pid]["wait"].append(interval)
        if kind == "comm":
            counter = calls.setdefault(pid, {})
            counter[event["name"]] = counter.get(event["name"], 0) + 1
    table = SummaryTable()
    for index, pid in enumerate(sorted(per_rank, key=lambda p: (not isinstance(p, int), p))):
        comm, compute = union(per_rank[pid]["comm"]), union(per_rank[pid]["compute"])
        comm_s = union_length(comm)
        compute_s = union_length(compute) - overlap(compute, comm)
        rank = pid if isinstance(pid, int) and len(per_rank) > 1 else index
        total = comm_s + compute_s
        wait_s = union_length(per_rank[pid]["wait"])
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
