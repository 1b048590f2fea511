"""A launch's ranks inside a sandbox (:mod:`reference_impl.comm.sandbox`).

One *host* process starts from the rank server like any rank and enters the namespaces; the
namespace's first process forks the ranks, waits for them and reports each one's exit; when
it exits, the kernel ends whatever is left in the namespace. Without namespaces (a box user,
:mod:`reference_impl.comm.user_box`), the host becomes the box's user instead, and what is left
of the box is ended when the launch ends. The caller sees each rank as a
:class:`SandboxedRank` (the part of :class:`multiprocessing.Process` the launcher uses), and
nothing that comes out of the sandbox is unpickled: exit codes travel as packed integers.
"""
from __future__ import annotations

import contextlib
import os
import signal
import struct
import traceback

from reference_impl.comm import sandbox as sandboxes
from reference_impl.comm import user_box
from reference_impl.comm.rank_payloads import send

_EXIT = struct.Struct("i")  # a rank's exit code, from the namespace's first process
_SIGNAL = struct.Struct("ii")  # (rank, signal) to deliver, from the caller
_WATCH_EVERY = 0.05  # seconds between the first process's looks at its ranks
_LONGEST_WAIT = 10.0  # seconds a join without a timeout waits for a rank's exit code


class SandboxedRank:
    """One rank of a sandboxed launch, seen from outside: its sentinel (readable once it has
    exited), its exit code, a way to signal it, and ending it (with the whole sandbox)."""
    pid = None  # its process number is the namespace's, meaningless outside

    def __init__(self, rank: int, host, exits, control):
        self.rank, self.host, self.exits, self.control = rank, host, exits, control
        self.exitcode = None

    @property
    def sentinel(self):
        return self.exits

    def join(self, timeout: float | None = None) -> None:
        """Wait for the rank's exit code (at most ``_LONGEST_WAIT`` seconds when no timeout is
        given: once its host is killed, the sandbox ends within milliseconds)."""
        if self.exitcode is not None or not self.exits.poll(
                _LONGEST_WAIT if timeout is None else timeout):
            return
        try:
            self.exitcode = _EXIT.unpack(self.exits.recv_bytes(_EXIT.size))[0]
        except (EOFError, OSError, struct.error):  # the sandbox ended before it reported
            self.exitcode = -signal.SIGKILL

    def is_alive(self) -> bool:
        self.join(0)
        return self.exitcode is None

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            self.control.send_bytes(_SIGNAL.pack(self.rank, signum))

    def terminate(self) -> None:
        self.host.terminate()  # the namespace's first process dies with the host

    def kill(self) -> None:
        self.host.kill()


def unavailable(sandbox) -> str | None:
    """Why ``sandbox`` cannot be made here, or None when it can."""
    return sandboxes.unavailable() if sandbox.uid is None else user_box.unavailable()


def start(context, sandbox, workdir: str, run_rank, rank_arguments: list[tuple],
          own_ends: list[list], results: str):
    """Start the host of ``len(rank_arguments)`` ranks, each running ``run_rank(*arguments)``;
    ``own_ends[r]`` are the connections only rank r keeps (its result and output pipes).
    Returns the host and the ranks."""
    exits = [context.Pipe(duplex=False) for _ in rank_arguments]
    control, control_end = context.Pipe(duplex=False)
    tree = sandboxes.tree_limits(sandbox, len(rank_arguments))
    host = context.Process(target=_run_host, name="sandbox", args=(
        sandbox, workdir, run_rank, rank_arguments, own_ends, [end for _, end in exits], control,
        results, tree))
    host.tree = tree  # removed by end(), once the sandbox has ended
    host.box_uid = sandbox.uid  # whose processes end() ends
    host.start()
    control.close()
    for _, end in exits:
        end.close()
    return host, [SandboxedRank(rank, host, reader, control_end)
                  for rank, (reader, _) in enumerate(exits)]


def end(host) -> None:
    """Wait for the host (it exits once every process of the sandbox has ended), or kill it;
    then end what a box user left running, and remove the control groups of its tree, if it
    had some."""
    host.join(timeout=2.0)
    if host.is_alive():
        host.kill()
        host.join()
    if host.box_uid is not None:
        user_box.end_everything_of(host.box_uid)
    if host.tree is not None:
        host.tree.remove()


def _run_host(sandbox, workdir, run_rank, rank_arguments, own_ends, exit_ends, control, results,
              tree):
    sandboxes.die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the caller's handler is the caller's
    try:
        enter = sandboxes.enter if sandbox.uid is None else user_box.enter
        enter(sandbox, workdir, len(rank_arguments), close_in_host=[
            *exit_ends, control, *(end for ends in own_ends for end in ends)], tree=tree)
    except BaseException as error:  # noqa: BLE001 - every rank reports it
        message = ("error", type(error).__name__, f"the sandbox could not be set up: {error}",
                   traceback.format_exc())
        for ends in own_ends:
            with contextlib.suppress(Exception):
                send(ends[0], message, results)
        os._exit(1)
    ranks = {}
    for rank, arguments in enumerate(rank_arguments):
        pid = os.fork()
        if pid == 0:
            for connection in [*exit_ends, control] + [end for other, ends in enumerate(own_ends)
                                                       if other != rank for end in ends]:
                connection.close()
            try:
                run_rank(*arguments)
            finally:
                os._exit(0)
        ranks[pid] = rank
    for ends in own_ends:
        for connection in ends:
            connection.close()
    _watch(ranks, exit_ends, control)
    os._exit(0)  # the namespace's first process: everything left in it ends now


def _watch(ranks: dict[int, int], exit_ends, control) -> None:
    """Until every rank has exited: deliver the caller's signals, reap every process that
    ends (orphans come here), and report each rank's exit code."""
    pids = {rank: pid for pid, rank in ranks.items()}
    while ranks:
        if control.poll(_WATCH_EVERY):
            try:
                rank, signum = _SIGNAL.unpack(control.recv_bytes())
            except (EOFError, OSError, struct.error):
                return  # the caller is gone
            if rank in pids and pids[rank] in ranks:
                with contextlib.suppress(OSError):
                    os.kill(pids[rank], signum)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
            rank = ranks.pop(pid, None)
            if rank is not None:
                with contextlib.suppress(OSError):
                    exit_ends[rank].send_bytes(_EXIT.pack(os.waitstatus_to_exitcode(status)))
                exit_ends[rank].close()
