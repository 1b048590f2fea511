"""The peak memory of a process tree: from a memory cgroup made for it where one can be (v2
``memory.peak``, v1 ``memory.max_usage_in_bytes``: each page counted once, the page cache the
tree added included), else from its summed RSS, read from /proc (sampled: an upper bound, a page
shared by several processes counts in each)."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


class CgroupPeak:
    """A memory cgroup made for one process tree, a child of this process's own: the kernel's
    peak of the memory charged to the tree, each page once."""

    def __init__(self, folder: Path, peak_file: str, method: str):
        self.folder, self.peak_file, self.method = folder, peak_file, method

    @staticmethod
    def make() -> CgroupPeak | None:
        """One where this process may make it (cgroup v2 with the memory controller given to
        its children, or v1 as root), else None."""
        for own, peak_file, method in own_memory_cgroups():
            folder = own / f"grading-cost-{os.getpid()}-{time.monotonic_ns()}"
            try:
                folder.mkdir()
            except OSError:
                continue
            if (folder / peak_file).exists():
                return CgroupPeak(folder, peak_file, method)
            with contextlib.suppress(OSError):
                folder.rmdir()
        return None

    def join(self) -> None:
        """Move the calling process in (in the child, before it runs the meter)."""
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int:
        return int((self.folder / self.peak_file).read_text())

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.folder.rmdir()


def own_memory_cgroups() -> list[tuple[Path, str, str]]:
    """This process's memory cgroup folders, v2 first: (folder, peak file, method)."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
        membership = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    mounts = {}  # "" (v2) or "memory" (v1) -> (mount point, the hierarchy's folder there)
    for line in mountinfo:
        fields = line.split()
        after = fields.index("-")
        kind, options = fields[after + 1], fields[after + 3].split(",")
        if kind == "cgroup2":
            mounts.setdefault("", (fields[4], fields[3]))
        elif kind == "cgroup" and "memory" in options:
            mounts["memory"] = (fields[4], fields[3])
    found = []
    for line in membership:
        _, controllers, path = line.split(":", 2)
        key = "memory" if "memory" in controllers.split(",") else controllers
        if key not in mounts or not path.startswith(mounts[key][1]):
            continue
        point, root = mounts[key]
        folder = Path(point) / os.path.relpath(path, root)
        found.append((folder, "memory.peak", "cgroup v2 memory.peak") if key == "" else
                     (folder, "memory.max_usage_in_bytes", "cgroup v1 max_usage"))
    return sorted(found, key=lambda entry: entry[2], reverse=True)


def tree_rss_bytes(root: int) -> int:
    """The summed resident memory of ``root`` and its descendants, read from /proc."""
    parent_of, rss_of = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parent_of[pid], rss_of[pid] = int(fields[1]), int(fields[21]) * PAGE
    members, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parent_of.items() if ppid == parent and pid not in members]
        members.update(children)
        frontier.extend(children)
    return sum(rss_of.get(pid, 0) for pid in members)
