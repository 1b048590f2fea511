"""How a launch's ranks fail, and how the launcher tells what went wrong.

:class:`RankFailure`: a rank raised, or died, before returning; when several ranks fail, the
first rank's *own* error is reported (:func:`root_cause`), not the connection errors its peers
got because of it, and an error from inside the communication backend gets the mistake that
most often causes it (:func:`likely_cause`). :class:`LaunchTimeout`: some ranks did not return
in time; each stuck rank is asked for its Python stack (faulthandler on SIGUSR1,
:func:`dump_stacks`) and the error shows where it was. A rank that died without a word is
described by its exit code or signal, and a result over the bytes a rank may send is left
unread (:func:`receive`); whether the rank server itself died is read from ``/proc``
(:func:`has_died`). :func:`reference_impl.comm.launcher.launch` raises them.
"""
from __future__ import annotations

import multiprocessing.forkserver
import os
import re
import signal
import sys
import time

from reference_impl.comm import data_budget
from reference_impl.comm.rank_payloads import load

_STACK_DUMP_WAIT = 0.5  # seconds for a stuck rank to write its stack after SIGUSR1
# Errors a rank sees *because another rank failed* (its peer's socket closed).
_KNOCK_ON_ERRORS = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError")
_KNOCK_ON_MESSAGES = ("Connection closed by peer", "Connection reset by peer")
# What the backend says (gloo's words, or how the rank died) -> the usual mistake behind it.
BACKEND_CAUSES = {
    "Pair is not connected": (
        "a rank sent to or received from itself (gloo has no connection from a rank to itself): "
        "a point-to-point peer computed as this very rank"),
    "Received data size doesn't match": (
        "a receive buffer of another size than the message sent to it: each receive's tensor "
        "must have its matching send's shape and dtype"),
    "is not part of group": (
        "a point-to-point peer outside the group: send, recv and P2POp take global ranks, not "
        "ranks within the group"),
    "killed by signal SIGABRT": (
        "the rank aborted inside the communication backend: most often a receive buffer of "
        "another size than the message sent to it"),
}


class RankFailure(RuntimeError):
    """A rank raised, or died, before returning. ``rank`` says which one."""

    def __init__(self, rank: int, summary: str, remote_traceback: str = "", others=()):
        self.rank = rank
        self.summary = summary
        self.remote_traceback = remote_traceback
        message = f"rank {rank} failed: {summary}"
        if others:
            message += "\n(then also: " + "; ".join(f"rank {r}: {s}" for r, s in others) + ")"
        cause = likely_cause([summary, *(s for _, s in others)])
        if cause:
            message += f"\nLikely cause: {cause}"
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


def receive(connection, process, result_kind):
    """The rank's message, or an error message saying how it died without sending one."""
    if connection.poll():
        limit = data_budget.MAX_MESSAGE_BYTES if result_kind == "data" else None
        try:
            return load(connection.recv_bytes(limit), result_kind)
        except EOFError:  # closed with nothing sent: the rank died
            pass
        except OSError as error:  # over the limit: left unread, and the connection closed
            if limit is None or "message length" not in str(error):
                raise
            return ("error", "ResultOverBudget", f"the rank's result is over "
                    f"{limit:,} bytes, the limit of what a rank may send", "")
    process.join(timeout=1.0)
    code = process.exitcode
    if code is not None and code < 0:
        how = f"killed by signal {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code}"
    return ("error", "ProcessDied", f"{how} before returning a result", "")


def likely_cause(texts) -> str | None:
    """The usual mistake behind the first backend message found in ``texts``, or None."""
    return next((cause for text in texts for words, cause in BACKEND_CAUSES.items()
                 if words in text), None)


def root_cause(failures) -> RankFailure:
    """Prefer a rank's own error over the connection errors its peers got because of it.

    Of the ranks that raised the first error heard, the lowest is reported, and the others are
    listed by rank: the same failure reads the same whichever rank's message arrived first.
    """
    own = [f for f in failures if not _is_knock_on(*f[1:3])]
    first = (own or failures)[0]
    rank, kind, text, remote_traceback = min(
        (f for f in failures if f[1:3] == first[1:3]), key=lambda f: f[0])
    others = sorted((r, f"{k}: {t}".splitlines()[0]) for r, k, t, _ in failures if r != rank)
    summary = f"{kind}: {text}" if kind != "ProcessDied" else text
    return RankFailure(rank, summary, remote_traceback, others)


def _is_knock_on(kind: str, text: str) -> bool:
    return kind in _KNOCK_ON_ERRORS or any(marker in text for marker in _KNOCK_ON_MESSAGES)


def dump_stacks(processes, ranks, workdir, start_up_files, lifeline) -> dict[int, str]:
    """Ask each stuck rank for its Python stack (faulthandler on SIGUSR1) and read it: the
    frames of the launched work (:func:`work_frames`)."""
    for rank in ranks:
        process = processes[rank]
        if process.is_alive():
            if hasattr(process, "send_signal"):  # a sandboxed rank: through the sandbox
                process.send_signal(signal.SIGUSR1)
            else:
                os.kill(process.pid, signal.SIGUSR1)
    time.sleep(_STACK_DUMP_WAIT)
    stacks = {}
    for rank in ranks:
        try:
            with open(os.path.join(workdir, f"rank{rank}.stack")) as handle:
                stack = handle.read()
        except OSError:
            stack = ""
        stacks[rank] = (work_frames(stack, start_up_files, lifeline)
                        or "(the rank did not answer)")
    return stacks


def work_frames(stack: str, start_up_files, lifeline: str) -> str:
    """From faulthandler's dump of every thread, the frames of the launched work: the thread
    running the function named ``lifeline`` is left out, and so are the frames below the
    rank's entry point (from the first frame in one of ``start_up_files``, the launcher's own
    start-up)."""
    threads = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack.strip())
    start_up = re.compile("|".join(re.escape(f'  File "{path}"') for path in start_up_files))
    kept = [start_up.split(thread)[0] for thread in threads if lifeline not in thread]
    return "\n".join(part for part in kept if part.strip())


def rank_server_pid() -> int | None:
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def has_died(pid: int, grace: float = 1.0) -> bool:
    """Whether process ``pid`` has ended, or ends within ``grace`` seconds: a process being
    killed closes its files (its ranks then see it gone) a moment before it is a zombie."""
    deadline = time.monotonic() + grace
    while _is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return not sys.platform.startswith("linux")  # elsewhere: assume it runs
