"""No file descriptor of the sandbox's set-up crosses into a sandboxed launch: a rank holds only
what the launch needs, never a folder (from one, ``/proc/self/fd/N/..`` would walk past the
empty folders that hide the class, the submissions and the results)."""
import os
import stat

import pytest

from reference_impl.comm.launcher import launch
from reference_impl.comm.sandbox import Sandbox
from reference_impl.course.sandboxing import probe

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"no sandbox here: {probe()}")
# What a rank needs besides its standard input and outputs (0, 1, 2): the launcher's pipes (its
# result, its lifeline, the rank server's), the backend's sockets and event poll, /dev/null
# (the rank server's stdin) and the file its stack is dumped to, in the launch's own folder.
NEEDED_KINDS = ("pipe:", "socket:", "anon_inode:")


def held_descriptors(visible):
    """(number, what it points to, a folder?, a bare path (O_PATH)?) for each descriptor this
    rank holds; the launch's own folder; and what it sees in ``visible``."""
    held = []
    for name in os.listdir("/proc/self/fd"):
        try:
            mode = os.fstat(int(name)).st_mode
            target = os.readlink(f"/proc/self/fd/{name}")
            with open(f"/proc/self/fdinfo/{name}") as info:
                flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
        except OSError:  # the descriptor that listed them, closed since
            continue
        held.append((int(name), target, stat.S_ISDIR(mode), bool(flags & os.O_PATH)))
    return held, os.environ["TMPDIR"], sorted(os.listdir(visible))


def test_a_rank_holds_only_what_the_launch_needs(tmp_path):
    """A folder kept visible inside a hidden one, named twice (as when the kit or its
    environment lies under the temporary folder and is on the path twice)."""
    hidden = tmp_path / "class"
    visible = hidden / "kit"
    (hidden / "other_student").mkdir(parents=True)
    visible.mkdir()
    (visible / "module.py").write_text("")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sandbox = Sandbox(readable=(str(visible), str(visible)), writable=(str(scratch), str(scratch)),
                      hidden=(str(hidden),))
    held, workdir, seen = launch(held_descriptors, 1, str(visible), sandbox=sandbox,
                                 results="data", timeout=60.0)[0]
    assert seen == ["module.py"]  # the folder is still there, bound in the view
    for number, target, folder, bare in held:
        assert not folder and not bare, f"descriptor {number} is {target}: {held}"
        assert number <= 2 or target.startswith(NEEDED_KINDS) or target == "/dev/null" \
            or target.startswith(workdir + "/"), f"descriptor {number} is {target}: {held}"
