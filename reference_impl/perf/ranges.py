"""Named ranges around modules' forward and backward and around every collective.

    with torch.profiler.profile() as prof, profiled(block):
        block(x).backward(upstream)

:func:`profiled` opens a ``torch.profiler.record_function`` range (and, on a GPU, an NVTX
range) around each chosen module's forward and backward ("attn forward", "mlp backward") and
around every ``torch.distributed`` collective and send/receive ("all_reduce", "batch_isend_irecv
wait"), and logs the time in flight of asynchronous collectives (:class:`InFlight`), which
:func:`reference_impl.perf.traces.rank_trace` adds to the rank's trace. :func:`range_kind`
tells a communication range from a compute range by its name. How the ranges nest, what each
one times, and how to read them in Perfetto or Nsight Systems: ``docs/profiling.md``.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.comm.comm_trace import _PAYLOAD_ARGUMENT
from reference_impl.comm.device import current_device

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


_in_flight_logs: list[list[InFlight]] = []  # one per open log (rank_trace), innermost last
_in_flight_lock = threading.Lock()


def _record_in_flight(op: str, work, start_ns: int):
    """Log an async collective's time in flight in every open log (:func:`open_in_flight_log`);
    its completion comes from the work's future, or from its wait() if that returns first (or
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


def open_in_flight_log() -> list[InFlight]:
    """A new log: every async collective :func:`profiled` sees from now on is appended to it
    (an :class:`InFlight`), until :func:`close_in_flight_log`."""
    log: list[InFlight] = []
    with _in_flight_lock:
        _in_flight_logs.append(log)
    return log


def close_in_flight_log(log: list[InFlight]) -> None:
    with _in_flight_lock:
        _in_flight_logs.remove(log)


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
