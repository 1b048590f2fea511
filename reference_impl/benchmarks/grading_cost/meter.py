"""The meter: runs a command, then waits for every process it left behind (it is their
subreaper: they are re-parented to it) and writes the CPU seconds of them all, since
``getrusage(RUSAGE_CHILDREN)`` counts each process once it is reaped, and the largest one's
peak RSS.

    python -m reference_impl.benchmarks.grading_cost.meter REPORT -- COMMAND...
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

LEFTOVERS_WAIT = 30.0  # seconds the meter waits for what the command left running
POLL = 0.05


def meter(report: Path, command: list[str]) -> int:
    """Run ``command``, then wait for every process it left behind (this process is their
    subreaper: they are re-parented here), and write the CPU seconds of them all and the
    largest one's peak RSS to ``report``."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    returncode = subprocess.call(command, stdin=subprocess.DEVNULL)
    reap_leftovers(time.monotonic() + LEFTOVERS_WAIT)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process reaped, and only them
    report.write_text(json.dumps({"cpu": usage.ru_utime + usage.ru_stime,
                                  "largest_process_bytes": usage.ru_maxrss * 1024}))
    return returncode


def reap_leftovers(deadline: float) -> None:
    """Reap this process's children until none is left; past ``deadline``, kill them first."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in own_children():
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
        time.sleep(POLL)


def own_children() -> list[int]:
    with contextlib.suppress(OSError):
        return [int(pid) for pid in
                Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()]
    return []


if __name__ == "__main__":  # REPORT -- COMMAND...
    sys.exit(meter(Path(sys.argv[1]), sys.argv[3:]))
