"""Run a function on N ranks and get every rank's return value back: ``launch(fn, 4, x)[r]``
is ``fn(x)`` as rank r returned it, with the default process group initialised in every rank
and ``current_device()`` its device (gloo on CPU ranks, NCCL with GPU r). Ranks fork from a
*rank server* (``forkserver``), never from the caller, whose autograd threads or CUDA context
would not survive a fork; under torchrun this process is one rank. Nothing hangs: a launch past
``timeout`` raises :class:`LaunchTimeout` with each stuck rank's line, a failing rank
:class:`RankFailure` with its traceback, and no process outlives the launch (each rank holds a
lifeline pipe from the caller and leads its own process group). ``results="data"``,
``output_limit``, ``rank_setup`` and ``sandbox`` are for untrusted code. How and why:
docs/library.md, "Running code on many ranks".
"""
from __future__ import annotations

import atexit
import contextlib
import faulthandler
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
import warnings
from datetime import timedelta
from multiprocessing.connection import wait

import cloudpickle
import torch
import torch.distributed as dist

from reference_impl.comm import rank_payloads, sandboxed_ranks
# current_device, wait_for_device and BACKENDS: the device policy, also reachable from here
from reference_impl.comm.device import (BACKENDS, current_device, gpu_count,  # noqa: F401
                                        resolve_backend, wait_for_device)
from reference_impl.comm.rank_failures import (LaunchTimeout, RankFailure, dump_stacks,
                                               has_died, rank_server_pid, receive, root_cause)
from reference_impl.comm.sandbox import Sandbox, SandboxError, die_with_parent
from reference_impl.comm.rank_payloads import (RESULT_KINDS, CappedOutput, on_cpu,
                                               pickle_the_work, redirect_output, send,
                                               unpickle_the_work)

default_rank_setup = None  # the rank_setup of a launch that gives none
DEFAULT_TIMEOUT = 60.0  # seconds a launch may take, from start to the last rank's return
START_METHODS = ("forkserver", "spawn", "fork")

# What the rank server imports once, so that a rank forked from it starts in milliseconds.
# torch imports torch._dynamo lazily at the first optimizer step, which would cost every
# rank seconds (measured: 4 s for a 2-rank launch against 0.07 s).
_RANK_SERVER_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "cloudpickle",
                        "reference_impl.comm.launcher"]

# The process group's own timeout is a backstop only: the parent's deadline comes first,
# so a hang is always reported the same way, with every stuck rank's stack.
_PROCESS_GROUP_SLACK = 30.0
_FAILURE_GRACE = 0.5  # seconds to hear from other failing ranks before choosing the cause
_FORK_WARNING = r".*use of fork\(\) may lead to deadlocks"
# Where a rank's own start-up runs: a stuck rank's stack is cut at the first of their frames.
_START_UP_FILES = (__file__, rank_payloads.__file__)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def default_start_method() -> str:
    """The rank server where the platform has one (Linux, macOS), else spawn (Windows)."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def start_rank_server() -> None:
    """Start the rank server now rather than at the first launch (it lives as long as this
    process, and ends with it)."""
    if default_start_method() == "forkserver":
        _context("forkserver")
        multiprocessing.forkserver.ensure_running()


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = DEFAULT_TIMEOUT,
           threads: int = 1, start_method: str | None = None, results: str = "any",
           output_limit: int | None = None, rank_setup=None, sandbox: Sandbox | None = None,
           **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the list of results by rank.

    ``start_method`` overrides how ranks start: ``"forkserver"`` (the default: forked from the
    rank server), ``"spawn"`` (a fresh interpreter per rank: slower), or ``"fork"`` (forked
    from this process: refused on a machine with a GPU, where it breaks autograd and CUDA).
    For code that must not be trusted: ``results="data"`` reads what a rank sends back with
    ``torch.load(weights_only=True)`` (no code of the sender's runs); ``output_limit`` keeps the
    first N bytes of each rank's output; ``rank_setup()`` runs in each rank before the work is
    unpickled (default :data:`default_rank_setup`); ``sandbox`` runs the ranks in namespaces of
    their own (:mod:`reference_impl.comm.sandbox`).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if results not in RESULT_KINDS:
        raise ValueError(f"results must be one of {', '.join(RESULT_KINDS)}, got {results!r}")
    if output_limit is not None and output_limit < 0:
        raise ValueError(f"output_limit must be a number of bytes >= 0, got {output_limit}")
    if under_torchrun():
        return _run_as_torchrun_rank(fn, world_size, args, kwargs, backend, timeout)
    backend = resolve_backend(backend, world_size)
    reason = sandboxed_ranks.unavailable(sandbox) if sandbox is not None else None
    if reason is not None:
        raise SandboxError(f"no sandbox can be made here: {reason}")
    start_method = _check_start_method(start_method or default_start_method())
    payload = pickle_the_work(fn, args, kwargs)
    setup = cloudpickle.dumps(rank_setup if rank_setup is not None else default_rank_setup)
    context = _context(start_method)
    workdir = tempfile.mkdtemp(prefix="launch-")
    lifeline, lifeline_end = context.Pipe(duplex=False)  # closed when this process ends
    processes, connections, outputs, host = [], [], [], None
    # A rank's parent: this process (fork, spawn), or one that ends with it (the rank
    # server; in a sandbox, the namespace's first process).
    expected_parent = os.getpid() if start_method != "forkserver" and sandbox is None else None
    try:
        with _main_module_hidden(), warnings.catch_warnings():
            # Python >= 3.12 warns on every fork from a process with threads; only the "fork"
            # method forks this process, and it is refused where that is unsafe.
            warnings.filterwarnings("ignore", _FORK_WARNING, DeprecationWarning)
            environment = {**os.environ, **(sandbox.environment(workdir) if sandbox else {})}
            rank_arguments, own_ends = [], []
            for rank in range(world_size):
                receiver, sender = context.Pipe(duplex=False)
                output_writer = None
                if output_limit is not None:
                    output = CappedOutput(context, output_limit)
                    outputs.append(output)
                    output_writer = output.writer
                rank_arguments.append((rank, world_size, backend, workdir, timeout, threads,
                                       expected_parent, lifeline, environment, sender,
                                       (setup, payload), results, output_writer))
                own_ends.append([end for end in (sender, output_writer) if end is not None])
                connections.append(receiver)
            if sandbox is None:
                for arguments in rank_arguments:
                    process = context.Process(target=_run_rank, name=f"rank{arguments[0]}",
                                              args=arguments)
                    process.start()
                    processes.append(process)
            else:
                host, processes = sandboxed_ranks.start(context, sandbox, workdir, _run_rank,
                                                        rank_arguments, own_ends, results)
            for ends in own_ends:
                ends[0].close()  # the rank holds the only sending end now
            for output in outputs:
                output.started()
        lifeline.close()
        server = rank_server_pid() if start_method == "forkserver" else None
        try:
            return _collect(processes, connections, timeout, workdir, results)
        except RankFailure as failure:
            if server is None or not has_died(server):
                raise
            raise RankFailure(failure.rank, failure.summary + " (the rank server, the ranks' "
                              "parent process, was killed during this launch)",
                              failure.remote_traceback) from None
    finally:
        _end(processes)
        if host is not None:
            sandboxed_ranks.end(host)
        for connection in connections:
            connection.close()
        lifeline_end.close()
        shutil.rmtree(workdir, ignore_errors=True)
        for rank, output in enumerate(outputs):
            output.report(f"rank {rank}")


def _check_start_method(start_method: str) -> str:
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}; choose one of "
                         f"{', '.join(START_METHODS)}")
    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"start_method {start_method!r} is not available on {sys.platform}")
    if start_method == "fork" and gpu_count() > 0:
        raise ValueError(
            f"start_method 'fork' is refused on a machine with a GPU ({gpu_count()} here): a "
            "process forked after this one ran a backward pass or touched CUDA fails in its "
            "first backward. Use the default (forkserver) or 'spawn'.")
    return start_method


def _context(start_method: str):
    context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(_RANK_SERVER_PRELOAD)  # only before the server starts
    return context


@contextlib.contextmanager
def _main_module_hidden():
    """Multiprocessing re-runs the caller's ``__main__`` script in every rank it starts
    without fork (so that functions defined there can be found); here they travel by value,
    so ranks are started with an empty ``__main__``: a script needs no main guard, and no
    rank re-imports a notebook kernel."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _run_as_torchrun_rank(fn, world_size, args, kwargs, backend, timeout):
    env_world_size = int(os.environ["WORLD_SIZE"])
    if env_world_size != world_size:
        raise ValueError(
            f"launch asked for {world_size} ranks but the environment (torchrun) has "
            f"WORLD_SIZE={env_world_size}")
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        _init_process_group(resolve_backend(backend, gpus_per_node), local_rank,
                            timeout=timedelta(seconds=timeout))
        # Whoever initialises the group ends it: left to the interpreter's exit, gloo's
        # threads can be torn down mid-flight and abort the process.
        atexit.register(_destroy_process_group)
    result = on_cpu(fn(*args, **kwargs))
    results = [None] * world_size
    dist.all_gather_object(results, result)
    return results


def _init_process_group(backend: str, local_rank: int, **options) -> None:
    """Under NCCL, bind this rank to GPU ``local_rank`` before and in the process group
    (``device_id``), so NCCL never has to guess the rank's GPU."""
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        options["device_id"] = device
    dist.init_process_group(backend, **options)


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _run_rank(rank, world_size, backend, workdir, timeout, threads, expected_parent, lifeline,
              environment, sender, payloads, results, output_writer):
    """Body of one rank's process: set up, run the work, send back ("ok", value) or the error."""
    _die_with_parent(expected_parent)
    with contextlib.suppress(OSError):  # its own process group: what it starts ends with it
        os.setsid()
    if output_writer is not None:
        redirect_output(output_writer)
    threading.Thread(target=_exit_when_caller_exits, args=(lifeline,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # so is a handler the parent installed
    stack_file = open(os.path.join(workdir, f"rank{rank}.stack"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        os.environ.clear()  # the caller's environment now, not the rank server's
        os.environ.update(environment)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        tempfile.tempdir = None  # found again from TMPDIR: the server's choice may be closed
        torch.set_num_threads(threads)
        setup, payload = payloads
        setup = unpickle_the_work(setup)
        if setup is not None:
            setup()
        fn, args, kwargs = unpickle_the_work(payload)
        _init_process_group(
            backend, rank, init_method="file://" + os.path.join(workdir, "store"), rank=rank,
            world_size=world_size, timeout=timedelta(seconds=timeout + _PROCESS_GROUP_SLACK))
        # Gloo may return from init on one rank while a peer is still completing its side of
        # their connection; a rank that then ran a short fn and exited would break it.
        dist.barrier()
        send(sender, ("ok", on_cpu(fn(*args, **kwargs))), results)
        # The result is sent; now wait for the peers, so that no rank closes its connections
        # while another may still be reading from them.
        dist.barrier()
    except BaseException as error:  # noqa: BLE001 - everything goes back to the parent
        send(sender, ("error", type(error).__name__, str(error), traceback.format_exc()),
              results)
    finally:
        _destroy_process_group()
        sender.close()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


def _die_with_parent(expected_parent: int | None) -> None:
    """Ask Linux to kill this rank if its parent process dies (e.g. SIGKILL). That parent is
    the caller (fork, spawn) or the rank server, which itself ends with the caller."""
    die_with_parent()
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the caller died before prctl took effect


def _exit_when_caller_exits(lifeline) -> None:
    """Only the caller holds the lifeline's other end: end of file means it has exited
    (or ended the launch), and this rank must not outlive it."""
    try:
        lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(1)


def _collect(processes, connections, timeout, workdir, result_kind) -> list:
    deadline = time.monotonic() + timeout
    results = [None] * len(processes)
    pending = set(range(len(processes)))
    failures = []  # (rank, error type name, summary, traceback), in order of arrival
    failures_deadline = float("inf")
    while pending:
        remaining = deadline - time.monotonic()
        if failures:
            remaining = min(remaining, failures_deadline - time.monotonic())
            if remaining <= 0:
                break
        elif remaining <= 0:
            ranks = sorted(pending)
            stacks = dump_stacks(processes, ranks, workdir, _START_UP_FILES,
                                 _exit_when_caller_exits.__name__)
            raise LaunchTimeout(ranks, timeout, stacks)
        waitables = {}
        for rank in pending:
            waitables[connections[rank]] = rank
            waitables[processes[rank].sentinel] = rank
        for ready in wait(list(waitables), timeout=remaining):
            rank = waitables[ready]
            if rank not in pending:
                continue
            message = receive(connections[rank], processes[rank], result_kind)
            pending.discard(rank)
            if message[0] == "ok":
                results[rank] = message[1]
            else:
                if not failures:
                    failures_deadline = time.monotonic() + _FAILURE_GRACE
                failures.append((rank, *message[1:]))
    if failures:
        raise root_cause(failures)
    return results


def _end(processes) -> None:
    """Terminate every rank still running, then kill what is left; reap them all. Then end
    each rank's process group: what the rank started (if it got as far as its own group)."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=2.0)
        if process.is_alive():
            process.kill()
            process.join()
    for process in processes:
        if process.pid is not None and process.pid != os.getpgrp():
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
