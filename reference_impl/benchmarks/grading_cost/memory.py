"""The peak memory of a process tree where no memory cgroup can be made for it
(:class:`reference_impl.comm.cgroups.TreeCgroup` reads the kernel's, each page once): its summed
RSS, read from /proc (sampled: an upper bound, a page shared by several processes counts in
each)."""
from __future__ import annotations

import os
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


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
