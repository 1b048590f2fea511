"""Run a function on N ranks and get every rank's return value back.

    from reference_impl.launcher import launch
    results = launch(fn, 4, x)      # results[r] is fn(x) as returned on rank r

Inside ``fn`` the default process group is initialised, so ``dist.get_rank()`` and every
collective just work.

Where it runs:

* **CPU** (backend ``gloo``): ranks are *forked*, so a function defined in a notebook cell
  can be launched (spawn would have to pickle it). Start-up is well under a second for 8
  ranks. Each rank uses ``threads`` intra-op threads (1 by default) so N ranks on a laptop
  do not fight over its cores.
* **CUDA** (backend ``nccl``): ranks are *spawned* (CUDA cannot be forked), rank r uses
  GPU r, and ``fn`` must be picklable (defined in a module, not a notebook).
* **Under torchrun** (``RANK`` and ``WORLD_SIZE`` in the environment) nothing is started:
  this process is one rank, the process group is initialised from the environment
  (``LOCAL_RANK`` picks the GPU), and every rank receives the list of all ranks' results.

Guarantees: each launch has its own rendezvous (a store file in a fresh temporary
directory, no port), so launches in parallel never collide. Nothing hangs: a rank that
does not return within ``timeout`` seconds (stuck in a collective, or looping) ends the
launch with :class:`LaunchTimeout`, which shows where each stuck rank was. The first rank
to fail raises :class:`RankFailure` in the parent with its rank and traceback. Either way
the other ranks are ended, and no process outlives the launch, also on Ctrl-C or when the
parent itself is killed.
"""
from __future__ import annotations

import atexit
import ctypes
import faulthandler
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = 60.0  # seconds a launch may take, from start to the last rank's return
BACKENDS = ("auto", "gloo", "nccl")

# The process group's own timeout is a backstop only: the parent's deadline comes first,
# so a hang is always reported the same way, with every stuck rank's stack.
_PROCESS_GROUP_SLACK = 30.0
_STACK_DUMP_WAIT = 0.5  # seconds for a stuck rank to write its stack after SIGUSR1
_FAILURE_GRACE = 0.5  # seconds to hear from other failing ranks before choosing the cause
# Errors a rank sees *because another rank failed* (its peer's socket closed).
_KNOCK_ON_ERRORS = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError")
_FORK_WARNING = r".*use of fork\(\) may lead to deadlocks"
_KNOCK_ON_MESSAGES = ("Connection closed by peer", "Connection reset by peer")


class RankFailure(RuntimeError):
    """A rank raised, or died, before returning. ``rank`` says which one."""

    def __init__(self, rank: int, summary: str, remote_traceback: str = "", others=()):
        self.rank = rank
        self.summary = summary
        self.remote_traceback = remote_traceback
        message = f"rank {rank} failed: {summary}"
        if others:
            message += "\n(then also: " + "; ".join(f"rank {r}: {s}" for r, s in others) + ")"
        if remote_traceback:
            message += f"\n\n--- traceback of rank {rank} ---\n{remote_traceback.rstrip()}"
        super().__init__(message)


class LaunchTimeout(TimeoutError):
    """Some ranks did not return within the launch's timeout. ``ranks`` says which."""

    def __init__(self, ranks: list[int], timeout: float, stacks: dict[int, str]):
        self.ranks = ranks
        self.stacks = stacks
        message = (
            f"rank(s) {', '.join(map(str, ranks))} did not finish within {timeout:g} s: "
            "stuck in a collective or send/recv that no other rank matches, or never returning"
        )
        for rank in ranks:
            message += f"\n\n--- rank {rank} was here ---\n{stacks.get(rank, '(no stack)').rstrip()}"
        super().__init__(message)


def resolve_backend(backend: str, world_size: int) -> str:
    """``auto`` is NCCL when there is a GPU for every rank, gloo on the CPU otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"backend nccl needs one GPU per rank: {world_size} ranks but {gpus} GPUs")
    return backend


def current_device() -> torch.device:
    """The device this rank computes on: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def wait_for_device() -> None:
    """Wait until this rank's GPU has finished its queued work (nothing to wait for on a CPU):
    call before reading a clock."""
    if current_device().type == "cuda":
        torch.cuda.synchronize()


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = DEFAULT_TIMEOUT,
           threads: int = 1, start_method: str | None = None, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the list of results by rank.

    ``start_method`` overrides the default (fork on CPU, spawn for NCCL), e.g. ``"spawn"``
    on a platform where forking is unsafe; spawned ranks need a picklable ``fn``.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if under_torchrun():
        return _run_as_torchrun_rank(fn, world_size, args, kwargs, backend, timeout)
    backend = resolve_backend(backend, world_size)
    if start_method is None:
        start_method = "spawn" if backend == "nccl" else "fork"
    if start_method == "fork":
        # torch imports torch._dynamo lazily, at the first optimizer step; in every forked rank
        # that costs seconds (measured here: 4 s for a 2-rank launch against 0.07 s). Import
        # it once here, and every rank inherits it.
        import torch._dynamo  # noqa: F401
    context = multiprocessing.get_context(start_method)
    workdir = tempfile.mkdtemp(prefix="launch-")
    processes, connections = [], []
    try:
        for rank in range(world_size):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=_run_rank, name=f"rank{rank}",
                args=(rank, world_size, backend, workdir, timeout, threads, os.getpid(),
                      sender, fn, args, kwargs))
            with warnings.catch_warnings():
                # Python >= 3.12 warns on every fork from a process with threads, as a Jupyter
                # kernel always is. Forking is this launcher's choice on the CPU (notebook
                # functions cannot be pickled); the warning would only clutter each cell.
                warnings.filterwarnings("ignore", _FORK_WARNING, DeprecationWarning)
                process.start()
            sender.close()
            processes.append(process)
            connections.append(receiver)
        return _collect(processes, connections, timeout, workdir)
    finally:
        _end(processes)
        for connection in connections:
            connection.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _run_as_torchrun_rank(fn, world_size, args, kwargs, backend, timeout):
    env_world_size = int(os.environ["WORLD_SIZE"])
    if env_world_size != world_size:
        raise ValueError(
            f"launch asked for {world_size} ranks but the environment (torchrun) has "
            f"WORLD_SIZE={env_world_size}")
    if not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend = resolve_backend(backend, gpus_per_node)
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        # Whoever initialises the group ends it: left to the interpreter's exit, gloo's
        # threads can be torn down mid-flight and abort the process.
        atexit.register(_destroy_process_group)
    result = fn(*args, **kwargs)
    results = [None] * world_size
    dist.all_gather_object(results, result)
    return results


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _run_rank(rank, world_size, backend, workdir, timeout, threads, parent_pid, sender,
              fn, args, kwargs):
    """Body of one rank's process: set up, run ``fn``, send back ("ok", value) or the error."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    stack_file = open(os.path.join(workdir, f"rank{rank}.stack"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        torch.set_num_threads(threads)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, init_method="file://" + os.path.join(workdir, "store"), rank=rank,
            world_size=world_size, timeout=timedelta(seconds=timeout + _PROCESS_GROUP_SLACK))
        # Gloo may return from init on one rank while a peer is still completing its side of
        # their connection; a rank that then ran a short fn and exited would break it.
        dist.barrier()
        _send(sender, ("ok", fn(*args, **kwargs)))
        # The result is sent; now wait for the peers, so that no rank closes its connections
        # while another may still be reading from them.
        dist.barrier()
    except BaseException as error:  # noqa: BLE001 - everything goes back to the parent
        _send(sender, ("error", type(error).__name__, str(error), traceback.format_exc()))
    finally:
        _destroy_process_group()
        sender.close()


def _send(sender, message) -> None:
    # Plain pickle copies tensors by value. The pipe's own pickler would share their storage
    # through this process, which may have exited by the time the parent reads the message.
    sender.send_bytes(pickle.dumps(message))


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this rank if the parent dies (e.g. SIGKILL), so none is orphaned."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _collect(processes, connections, timeout, workdir) -> list:
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
            raise LaunchTimeout(ranks, timeout, _dump_stacks(processes, ranks, workdir))
        waitables = {}
        for rank in pending:
            waitables[connections[rank]] = rank
            waitables[processes[rank].sentinel] = rank
        for ready in wait(list(waitables), timeout=remaining):
            rank = waitables[ready]
            if rank not in pending:
                continue
            message = _receive(connections[rank], processes[rank])
            pending.discard(rank)
            if message[0] == "ok":
                results[rank] = message[1]
            else:
                if not failures:
                    failures_deadline = time.monotonic() + _FAILURE_GRACE
                failures.append((rank, *message[1:]))
    if failures:
        raise _root_cause(failures)
    return results


def _receive(connection, process):
    """The rank's message, or an error message saying how it died without sending one."""
    if connection.poll():
        try:
            return pickle.loads(connection.recv_bytes())
        except EOFError:  # closed with nothing sent: the rank died
            pass
    process.join(timeout=1.0)
    code = process.exitcode
    if code is not None and code < 0:
        how = f"killed by signal {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code}"
    return ("error", "ProcessDied", f"{how} before returning a result", "")


def _root_cause(failures) -> RankFailure:
    """Prefer a rank's own error over the connection errors its peers got because of it."""
    own = [f for f in failures if not _is_knock_on(*f[1:3])]
    rank, kind, text, remote_traceback = (own or failures)[0]
    others = [(r, f"{k}: {t}".splitlines()[0]) for r, k, t, _ in failures if r != rank]
    summary = f"{kind}: {text}" if kind != "ProcessDied" else text
    return RankFailure(rank, summary, remote_traceback, others)


def _is_knock_on(kind: str, text: str) -> bool:
    return kind in _KNOCK_ON_ERRORS or any(marker in text for marker in _KNOCK_ON_MESSAGES)


def _dump_stacks(processes, ranks, workdir) -> dict[int, str]:
    """Ask each stuck rank for its Python stack (faulthandler on SIGUSR1) and read it."""
    for rank in ranks:
        if processes[rank].is_alive():
            os.kill(processes[rank].pid, signal.SIGUSR1)
    time.sleep(_STACK_DUMP_WAIT)
    stacks = {}
    for rank in ranks:
        try:
            with open(os.path.join(workdir, f"rank{rank}.stack")) as handle:
                stack = handle.read()
        except OSError:
            stack = ""
        # Frames below the rank's entry point are the launcher's own start-up: drop them.
        stacks[rank] = stack.split(f"  File \"{__file__}\"")[0] or "(the rank did not answer)"
    return stacks


def _end(processes) -> None:
    """Terminate every rank still running, then kill what is left; reap them all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=2.0)
        if process.is_alive():
            process.kill()
            process.join()
