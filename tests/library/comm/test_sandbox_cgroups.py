"""A sandboxed launch's whole tree in control groups of its own, where this machine lets them be
made (as root, cgroup v1 or v2): its processes bounded even for root, whom ``RLIMIT_NPROC``
does not bound, and its memory; the groups removed when the launch ends, however it ends."""
import os
import signal
import time

import pytest

from reference_impl.comm.cgroups import TreeCgroup, own_folders
from reference_impl.comm.launcher import launch
from reference_impl.comm.rank_failures import LaunchTimeout
from reference_impl.comm.sandbox import THREADS_PER_RANK, Sandbox, unavailable

_probe = TreeCgroup.make("kit-probe") if unavailable() is None else None
if _probe is not None:
    _probe.remove()
pytestmark = pytest.mark.skipif(_probe is None, reason="no sandbox, or no cgroup this user may "
                                                       "make here (root, v1 or delegated v2)")
PREFIX = "kit-sandbox-"


def sandboxed(fn, *args, world_size=1, timeout=30.0, **options):
    return launch(fn, world_size, *args, sandbox=Sandbox(**options), timeout=timeout,
                  results="data")


def start_processes(most: int) -> int:
    """How many sleeping children this rank could start, trying ``most``."""
    started = 0
    for _ in range(most):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            signal.pause()
            os._exit(0)
        started += 1
    return started


def own_limits() -> dict:
    """The limits of the cgroups this rank is in, as the kernel holds them."""
    found = {}
    for controller, names in (("pids", ("pids.max",)),
                              ("memory", ("memory.max", "memory.limit_in_bytes"))):
        for folder, _ in own_folders(controller):
            for name in names:
                if (folder / name).exists():
                    found[controller] = (folder.name, (folder / name).read_text().strip())
    return found


def leftovers() -> list[str]:
    """The groups this process's launches made that are still there (another grader's, on the
    same machine at the same time, are not this test's)."""
    return sorted(str(folder) for controller in ("pids", "memory")
                  for own, _ in own_folders(controller)
                  for folder in own.glob(f"{PREFIX}{os.getpid()}-*"))


def test_processes_are_bounded_for_the_whole_tree_even_for_root():
    before = leftovers()
    bound = 20 + THREADS_PER_RANK + 4  # and room for the rank's threads, the host, process 1
    started = sandboxed(start_processes, 2000, processes=20)[0]
    assert started <= bound, started
    assert leftovers() == before


def test_the_tree_s_limits_are_what_the_sandbox_sets():
    limits = sandboxed(own_limits, world_size=2, processes=30, memory_bytes=3 << 30)
    for found in limits:
        assert found["pids"][0].startswith(PREFIX) and found["pids"][1] == str(30 + 2 * THREADS_PER_RANK + 4)
        assert found["memory"][0].startswith(PREFIX)
        assert int(found["memory"][1]) == (3 << 30) * (2 + 2)


def stuck():
    while True:
        time.sleep(0.1)


def test_the_groups_go_when_a_launch_is_ended():
    before = leftovers()
    with pytest.raises(LaunchTimeout):
        sandboxed(stuck, world_size=2, timeout=2.0)
    assert leftovers() == before


def test_groups_left_by_a_killed_grader_are_removed_by_the_next_launch():
    dead = max(int(name) for name in os.listdir("/proc") if name.isdigit()) + 100_000
    orphans = [own / f"{PREFIX}{dead}-1" for controller in ("pids", "memory")
               for own, _ in own_folders(controller)]
    for orphan in orphans:
        orphan.mkdir(exist_ok=True)
    sandboxed(os.getpid)
    assert not [orphan for orphan in orphans if orphan.exists()]
