"""A sandbox where no namespace can be made (a container that forbids them, as Docker's default
security profile does, Gradescope's among them): the launch runs as an unprivileged user of its
own, as IOI's isolate gives each box a uid. Root only: root sets up the box, then drops to it.

What a ``Sandbox(uid=...)`` holds by the kernel's file permissions instead of mounts: the
launch's folder and the ``writable`` folders belong to the box's user; the ``readable`` ones are
opened to it (their parents only to pass through); the ``hidden`` folders and the files in
``replaced`` are closed to every user but their owner, and stay so (the box is for a machine
that grades and nothing else). The process limit holds (the box's user is not root), so do the
memory and file-size limits and the tree's control groups where they can be made; whatever the
launch leaves running is ended with it (:func:`end_everything_of`). What it does not cover
(the machine's processes and network are in view): docs/grading.md, 'Untrusted code'.
"""
from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import time

from reference_impl.comm import sandbox as namespaces
from reference_impl.comm.cgroups import TreeCgroup

# The box's user: no account's (no name, no home, no files of its own outside the box).
BOX_UID = 60_917


def unavailable() -> str | None:
    """Why a box user cannot be set up here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "a box user needs Linux"
    if os.getuid() != 0:
        return "a box user needs root (to give the launch its folders and drop to the user)"
    for needed in needed_to_run():
        closed = closed_on_the_way(needed)
        if closed is not None:
            return (f"the box user cannot reach {needed} (Python, or the kit): {closed} is "
                    f"closed to other users; open it (chmod o+x {closed}) or install Python "
                    "and the kit where every user may read them")
    return None


def needed_to_run() -> list[str]:
    """What every rank reads: the interpreter's folders and the kit's."""
    kit = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [os.path.realpath(path) for path in (sys.base_prefix, sys.prefix, kit)]


def closed_on_the_way(path: str) -> str | None:
    """The first folder on the way to ``path`` (itself included) that other users may not
    pass through, or None."""
    parts = path.split(os.sep)
    for end in range(2, len(parts) + 1):
        folder = os.sep.join(parts[:end]) or os.sep
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def enter(sandbox, workdir: str, ranks: int, close_in_host=(),
          tree: TreeCgroup | None = None) -> None:
    """Give the box its folders, limit it, and become its user (for good: no capability is
    left, and no exec can bring one back). ``close_in_host`` is the namespaces' (unused)."""
    if tree is not None:
        tree.join()
    uid = sandbox.uid
    for path in (*sandbox.hidden, *(target for target, _ in sandbox.replaced)):
        _close(path)
    for path in (workdir, *sandbox.writable, sandbox.cache):
        if path:
            os.makedirs(path, exist_ok=True)
            _pass_through_parents(path)
            _give(path, uid)
    for path in sandbox.readable:
        _pass_through_parents(path)
        _open_to_all(path)
    os.chdir(workdir)
    namespaces.limit(sandbox, namespaces.processes_of(uid) + sandbox.processes, ranks)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # root's capabilities go with it
    namespaces.no_new_privileges()


def end_everything_of(uid: int, rounds: int = 20) -> None:
    """Kill every process of user ``uid`` (a box's: what a launch left running), as that user:
    ``kill(-1)`` reaches all of them and nothing else; again until none is left."""
    for _ in range(rounds):
        if not namespaces.processes_of(uid, running_only=True):
            return
        child = os.fork()
        if child == 0:
            try:
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        time.sleep(0.01)


def _close(path: str) -> None:
    """Nothing in ``path`` for users other than its owner and group (its parents may still
    be passed through, to reach what is opened below it)."""
    with contextlib.suppress(FileNotFoundError):
        mode = os.lstat(path).st_mode
        if not stat.S_ISLNK(mode):
            os.chmod(path, stat.S_IMODE(mode) & ~0o007)


def _pass_through_parents(path: str) -> None:
    """Every folder above ``path`` may be passed through (not listed) by any user."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent != os.path.dirname(parent):
        mode = stat.S_IMODE(os.stat(parent).st_mode)
        if not mode & stat.S_IXOTH:
            os.chmod(parent, mode | stat.S_IXOTH)
        parent = os.path.dirname(parent)


def _open_to_all(path: str) -> None:
    """``path`` and what it holds readable by any user (folders listed and passed through)."""
    _each_in(path, lambda name, mode, folder: os.chmod(
        name, stat.S_IMODE(mode) | (0o005 if stat.S_ISDIR(mode) else 0o004), dir_fd=folder))


def _give(path: str, uid: int) -> None:
    """``path`` and what it holds owned by ``uid``."""
    _each_in(path, lambda name, mode, folder: os.chown(name, uid, uid, dir_fd=folder,
                                                       follow_symlinks=False))


def _each_in(path: str, change) -> None:
    """``change(name, mode, folder)`` on ``path`` and everything under it, walked by file
    descriptor and never through a link, so that a link the box's user put there (to the
    grader's files) is never followed."""
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        change(".", os.fstat(top).st_mode, top)
    finally:
        os.close(top)
    for _, folders, files, folder in os.fwalk(path, follow_symlinks=False):
        for name in (*folders, *files):
            with contextlib.suppress(FileNotFoundError):
                mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
                if not stat.S_ISLNK(mode):
                    change(name, mode, folder)
