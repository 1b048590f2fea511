"""Limits on a whole process tree from the kernel's control groups, as IOI's isolate sets them.

``setrlimit`` bounds each process, and its process limit does not hold for root (the kernel does
not count root's processes); a control group bounds a tree, whoever runs it: its processes
(``pids.max``) and its memory, each page once, shared memory included (``memory.max``, v1
``memory.limit_in_bytes``). :class:`TreeCgroup` makes one such group per launch, a child of this
process's own (cgroup v2 where the controllers are given to its children, v1 where this process
may write the hierarchy: as root), or says why it cannot. The sandbox and the grading benchmark
use it (``reference_impl/comm/sandbox.py``, ``reference_impl/benchmarks/grading_cost``).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

# Per controller and version: the file of its limit, and of its peak (memory only).
LIMIT_FILES = {("pids", "v2"): "pids.max", ("pids", "v1"): "pids.max",
               ("memory", "v2"): "memory.max", ("memory", "v1"): "memory.limit_in_bytes"}
PEAK_FILES = {"v2": "memory.peak", "v1": "memory.max_usage_in_bytes"}


def own_folders(controller: str) -> list[tuple[Path, str]]:
    """This process's cgroup folders holding ``controller`` ("memory", "pids"), v2 first:
    (folder, "v2" or "v1")."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
        membership = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    mounts = {}  # "v2" or "v1" -> (mount point, the hierarchy's folder there)
    for line in mountinfo:
        fields = line.split()
        after = fields.index("-")
        kind, options = fields[after + 1], fields[after + 3].split(",")
        if kind == "cgroup2":
            mounts.setdefault("v2", (fields[4], fields[3]))
        elif kind == "cgroup" and controller in options:
            mounts["v1"] = (fields[4], fields[3])
    found = []
    for line in membership:
        _, controllers, path = line.split(":", 2)
        version = "v1" if controller in controllers.split(",") else "v2" if not controllers else None
        if version not in mounts or not path.startswith(mounts[version][1]):
            continue
        point, root = mounts[version]
        folder = Path(point) / os.path.relpath(path, root)
        if version == "v2" and controller not in _given_to_children(folder):
            continue
        found.append((folder, version))
    return sorted(found, key=lambda entry: entry[1], reverse=True)


def _given_to_children(folder: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return (folder / "cgroup.subtree_control").read_text().split()
    return []


class TreeCgroup:
    """A cgroup per controller made for one process tree; :meth:`remove` once it has ended."""

    def __init__(self, folders: dict[str, tuple[Path, str]]):
        self.folders = folders  # controller -> (its folder, "v2" or "v1")

    @staticmethod
    def make(prefix: str, controllers=("pids", "memory")) -> TreeCgroup | None:
        """One holding every one of ``controllers`` where this process may make them, else
        None (nothing is left behind)."""
        name = f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"
        made = TreeCgroup({})
        for controller in controllers:
            for own, version in own_folders(controller):
                _remove_orphans(own, prefix)
                folder = own / name  # under v2, one folder holds every controller
                try:
                    folder.mkdir(exist_ok=True)
                except OSError:
                    continue
                if (folder / LIMIT_FILES[controller, version]).exists():
                    made.folders[controller] = (folder, version)
                    break
                if folder not in {kept for kept, _ in made.folders.values()}:
                    with contextlib.suppress(OSError):
                        folder.rmdir()
            if controller not in made.folders:
                made.remove()
                return None
        return made

    def limit(self, controller: str, value: int) -> None:
        folder, version = self.folders[controller]
        (folder / LIMIT_FILES[controller, version]).write_text(str(value))

    def peak_memory_bytes(self) -> int:
        folder, version = self.folders["memory"]
        return int((folder / PEAK_FILES[version]).read_text())

    @property
    def memory_method(self) -> str:
        """How the peak is read, in words: ``"cgroup v1 memory.max_usage_in_bytes"``."""
        _, version = self.folders["memory"]
        return f"cgroup {version} {PEAK_FILES[version]}"

    def join(self) -> None:
        """Move the calling process in: what it starts from now on is in the tree."""
        for folder in {folder for folder, _ in self.folders.values()}:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self, wait: float = 5.0) -> None:
        """Remove the groups, waiting up to ``wait`` seconds for their last processes to go."""
        deadline = time.monotonic() + wait
        for folder in {folder for folder, _ in self.folders.values()}:
            while folder.exists():
                try:
                    folder.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


def _remove_orphans(folder: Path, prefix: str) -> None:
    """Remove the empty groups ``prefix`` left by a process that is gone (killed before it
    could remove them)."""
    with contextlib.suppress(OSError):
        for orphan in folder.glob(f"{prefix}-*-*"):
            maker = orphan.name[len(prefix) + 1:].split("-")[0]
            if maker.isdigit() and not Path(f"/proc/{maker}").exists():
                with contextlib.suppress(OSError):
                    orphan.rmdir()
