"""Which sandbox a graded run's launches get (``--sandbox``), and the line that says so.

``namespaces`` (:mod:`reference_impl.comm.sandbox`) where a sandboxed launch works here;
``none`` where it does not (``auto`` then says why, ``namespaces`` refuses to grade), or when
asked for; ``user`` (:mod:`reference_impl.comm.user_box`) only when asked for: as root, where no
namespace can be made, each launch as an unprivileged user of its own. The batch grader does
not fall back: where none can be made, ``auto`` refuses too, so that a class is never graded
unsandboxed by accident. The grading documentation says what each mode guarantees.
"""
from __future__ import annotations

import functools
import os

from reference_impl.comm.cgroups import TreeCgroup
from reference_impl.comm.launcher import launch
from reference_impl.comm.sandbox import Sandbox, unavailable
from reference_impl.comm.user_box import BOX_UID
from reference_impl.comm.user_box import unavailable as no_box_user

MODES = ("auto", "namespaces", "user", "none")
# What the run's one sandbox line says; the whole of it: docs/grading.md, 'Untrusted code'.
COVERED = ("each launch sees only its own processes and a student's view of the kit, writes only "
           "its scratch, reaches no network, is limited in memory and processes; not covered: "
           "docs/grading.md, 'Untrusted code: the sandbox'")
AS_A_USER = (f"each launch runs as an unprivileged user of its own (uid {BOX_UID}): it reads "
             "none of the grader's closed files, writes only its scratch and the machine's "
             "shared temporary folders, is limited in memory and processes and ends with its "
             "launch; not covered: docs/grading.md, 'Untrusted code: the sandbox'")
NOT_COVERED = ("the submission's code runs with your rights; grade inside a container "
               "(docs/grading.md, 'Untrusted code: the sandbox')")


def _nothing():
    return None


@functools.cache
def probe() -> str | None:
    """None where a sandboxed launch works on this machine, else why not (tried once)."""
    reason = unavailable()
    if reason is not None:
        return reason
    try:
        launch(_nothing, 1, sandbox=Sandbox(), timeout=60.0, results="data")
    except Exception as error:  # noqa: BLE001 - the reason is the answer
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return None


def choose(mode: str, fall_back: bool = True) -> tuple[bool, str]:
    """Whether launches run sandboxed under ``mode``, and a line saying what that covers.
    Without ``fall_back``, ``auto`` refuses (ValueError) where no sandbox can be made."""
    if mode not in MODES:
        raise ValueError(f"--sandbox {mode}: choose one of {', '.join(MODES)}")
    if mode == "none":
        return False, f"sandbox: none (asked for): {NOT_COVERED}"
    if mode == "user":
        reason = no_box_user()
        if reason is not None:
            raise ValueError(f"--sandbox user: {reason}")
        return True, f"sandbox: user: {AS_A_USER}"
    reason = probe()
    if reason is None:
        return True, f"sandbox: namespaces: {COVERED}"
    if mode == "namespaces":
        raise ValueError(f"--sandbox namespaces: no sandbox can be made here: {reason}")
    if not fall_back:
        raise ValueError(f"--sandbox auto: no sandbox can be made here ({reason}), and the "
                         "class is not graded without one unless asked: fix what that names, or "
                         "grade inside a container with --sandbox none (docs/grading.md, "
                         "'Untrusted code: the sandbox')")
    return False, f"sandbox: none ({reason}): {NOT_COVERED}"


def limits(sandboxed: bool) -> dict[str, str]:
    """Each limit on a graded launch -> whether it holds on this machine (and as this user)."""
    if not sandboxed:
        return {"every limit but time": "no sandbox here: only the time limits hold"}
    tree = TreeCgroup.make("kit-probe")
    if tree is not None:
        tree.remove()
        versions = "/".join(sorted({version for _, version in tree.folders.values()}))
    as_root = os.getuid() == 0
    processes = ("holds for the whole tree (cgroup " + versions + " pids.max)" if tree else
                 "does not hold: the kernel does not count root's processes, and no cgroup can "
                 "be made here; grade as an unprivileged user" if as_root else
                 "holds per user (setrlimit RLIMIT_NPROC)")
    return {
        "memory per process": "holds (setrlimit RLIMIT_DATA)",
        "memory of the whole tree": ("holds (cgroup " + versions + " memory limit)" if tree else
                                     "not bounded: no cgroup can be made here"),
        "shared memory (/dev/shm)": "holds: the launch's own, one process's worth",
        "file size": "holds (setrlimit RLIMIT_FSIZE)",
        "processes": processes,
        "the scratch's size and file count": "holds in the class grader (a tmpfs of its own, "
                                             "in a user namespace as any user); one file at a "
                                             "time in a pytest run by hand",
        "a launch's time": "holds, from the launch's start (a test may set a longer one)",
    }
