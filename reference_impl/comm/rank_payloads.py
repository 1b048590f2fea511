"""What travels between a launch's caller and its ranks: the work, the results, the output.

The work goes by value (cloudpickle); a rank's result comes back by cloudpickle, or with
``results="data"`` as ``torch.save`` bytes read with ``torch.load(weights_only=True)``, which runs
no code of the sender's, then held to :mod:`reference_impl.comm.data_budget`'s bounds before
anything formats it; a rank's output is capped at ``output_limit`` bytes
(:class:`CappedOutput`). :func:`reference_impl.comm.launcher.launch` uses them. What each
carries: docs/library.md, 'Running code on many ranks'.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import pickle
import re
import sys
import threading
import warnings

import cloudpickle
import torch

from reference_impl.comm import data_budget

RESULT_KINDS = ("any", "data")  # how a rank's return value travels: cloudpickle, or data only
_OUTPUT_JOIN = 2.0  # seconds to wait for the last of a rank's output after it ended


def pickle_the_work(fn, args, kwargs) -> bytes:
    """``fn`` and its arguments by value, so that a function defined in a notebook cell or a
    script's ``__main__`` reaches the ranks; CUDA tensors among the arguments travel on the
    CPU (each rank moves what it needs to its own device)."""
    fn = _by_name_if_main_is_a_module(fn)
    try:
        return cloudpickle.dumps((fn, on_cpu(args), on_cpu(kwargs)))
    except Exception as error:  # noqa: BLE001 - re-raised with what to do about it
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"launch cannot send {name} and its arguments to the ranks: {type(error).__name__}: "
            f"{error}. They travel to every rank by value (pickled), so pass data (tensors, "
            "numbers, modules) rather than open files, locks, threads or processes.") from error


def _by_name_if_main_is_a_module(fn):
    """Under ``python -m package.module``, a function of that module is sent as
    ``package.module.<name>`` (imported by name in the rank, like every module's function)
    rather than by value: the ranks then see the module's globals as they are, whatever
    they hold."""
    main = sys.modules["__main__"]
    module_name = getattr(getattr(main, "__spec__", None), "name", None)
    if getattr(fn, "__module__", None) != "__main__" or not module_name \
            or module_name.endswith("__main__"):
        return fn
    found = importlib.import_module(module_name)
    for part in getattr(fn, "__qualname__", "<local>").split("."):
        found = getattr(found, part, None)
    return found if callable(found) else fn


def on_cpu(value, _done: dict | None = None):
    """``value`` with every tensor in it (also inside lists, tuples and dicts) on the CPU; what
    it holds more than once is copied once and stays shared, so the copy is no larger."""
    done = {} if _done is None else _done  # id of a value -> its copy
    if id(value) in done:
        return done[id(value)]
    if isinstance(value, torch.Tensor):
        copy = value if value.device.type == "cpu" else value.detach().cpu()
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        copy = type(value)(*(on_cpu(item, done) for item in value))
    elif isinstance(value, (list, tuple)):
        copy = type(value)(on_cpu(item, done) for item in value)
    elif isinstance(value, dict):
        copy = type(value)((key, on_cpu(item, done)) for key, item in value.items())
    else:
        return value
    done[id(value)] = copy
    return copy


class WorkNotLoadable(RuntimeError):
    """A rank could not rebuild the launched function or its arguments."""


def unpickle_the_work(payload: bytes):
    try:
        return cloudpickle.loads(payload)
    except Exception as error:  # noqa: BLE001 - re-raised with what to do about it
        raise WorkNotLoadable(
            f"the rank could not load the launched function or its arguments: "
            f"{type(error).__name__}: {error}. Functions and classes defined in a notebook or "
            "script travel by value, but those of a module are imported by name in every "
            "rank: that module must be importable there (the rank has the caller's sys.path "
            "and working directory), so not a file loaded by path or a module that exists "
            "only in memory.") from error


def send(sender, message, result_kind: str) -> None:
    # By value (cloudpickle, which plain pickle can read): tensors are copied, not shared
    # through this process, which may have exited by the time the parent reads the message.
    # As data: torch.save's format, which the parent reads without running any code.
    if result_kind == "any":
        sender.send_bytes(cloudpickle.dumps(message))
        return
    buffer = io.BytesIO()
    try:
        torch.save(message, buffer, pickle_protocol=2)
    except Exception as error:  # noqa: BLE001 - reported as this rank's failure
        buffer = io.BytesIO()
        torch.save(("error", "ResultNotData", _NOT_DATA.format(f"{type(error).__name__}: "
                                                               f"{error}"), ""), buffer)
    sender.send_bytes(buffer.getvalue())


_NOT_DATA = ("the rank's result is not data ({}): with results='data' a rank returns tensors, "
             "numbers, strings, None, and lists, tuples and dicts of them")


def load(data: bytes, result_kind: str):
    if result_kind == "any":
        return pickle.loads(data)
    try:
        with warnings.catch_warnings():  # torch warns on pickle protocols newer than its own
            warnings.simplefilter("ignore")
            message = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001 - reported as this rank's failure
        reason = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        found = f"it holds a {reason.group(1)}" if reason else type(error).__name__
        return ("error", "ResultNotData", _NOT_DATA.format(found), "")
    try:  # before anything formats or compares it
        data_budget.check(message, "the rank's result")
    except data_budget.OverBudget as error:
        return ("error", "ResultOverBudget", str(error), "")
    well_formed = isinstance(message, tuple) and (
        (len(message) == 2 and message[0] == "ok")
        or (len(message) == 4 and message[0] == "error"
            and all(isinstance(part, str) for part in message[1:])))
    if not well_formed:
        return ("error", "ResultNotData", "the rank sent a message the launcher did not write",
                "")
    return message


class CappedOutput:
    """A rank's stdout and stderr, through a pipe the caller drains: the first ``limit`` bytes
    are kept, the rest only counted, so a rank that prints without end costs no memory or
    disk."""

    def __init__(self, context, limit: int):
        self.limit = limit
        self.reader, self.writer = context.Pipe(duplex=False)
        self.kept, self.total = bytearray(), 0
        self.thread = threading.Thread(target=self._drain, daemon=True)

    def started(self) -> None:
        self.writer.close()  # the rank holds the only writing end now
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.reader.fileno(), 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            self.total += len(chunk)
            room = self.limit - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]

    def report(self, who: str) -> None:
        """Print what was kept (after the rank and everything it started have ended)."""
        self.thread.join(timeout=_OUTPUT_JOIN)
        self.reader.close()
        if self.total:
            text = self.kept.decode(errors="replace")
            cut = (f"\n[... {self.total - len(self.kept)} more bytes of output left out: "
                   f"the first {self.limit} are kept]" if self.total > len(self.kept) else "")
            # Each line marked as the rank's, so that none can pass for the grader's own.
            lines = "\n".join("| " + line for line in text.rstrip().splitlines())
            print(f"--- output of {who} ---\n{lines}{cut}", flush=True)


def redirect_output(writer) -> None:
    """This process's file descriptors 1 and 2 (stdout, stderr) become ``writer``'s pipe."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(writer.fileno(), 1)
    os.dup2(writer.fileno(), 2)
    writer.close()
