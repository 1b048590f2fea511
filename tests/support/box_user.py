"""Tests of a box user (reference_impl/comm/user_box.py): it runs only where the interpreter and
the kit are open to other users, as a grading container's are (Python under /usr). Where they
lie under a closed folder (a pyenv in /root), :func:`open_to_a_box_user` opens each closed
folder on the way to other users (passing through only, o+x) while a test runs, and gives each
its mode back afterwards."""
import contextlib
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from reference_impl.comm.user_box import closed_on_the_way, needed_to_run, unavailable

ROOT_ON_LINUX = sys.platform.startswith("linux") and os.getuid() == 0
needs_root = pytest.mark.skipif(not ROOT_ON_LINUX, reason="a box user needs root on Linux")


@contextlib.contextmanager
def open_to_a_box_user():
    opened = []
    try:
        for needed in needed_to_run():
            while (closed := closed_on_the_way(needed)) is not None:
                opened.append((closed, os.stat(closed).st_mode))
                os.chmod(closed, stat.S_IMODE(opened[-1][1]) | stat.S_IXOTH)
        assert unavailable() is None, unavailable()
        yield
    finally:
        for folder, mode in reversed(opened):
            os.chmod(folder, stat.S_IMODE(mode))


@contextlib.contextmanager
def reachable_folder(name: str):
    """A new folder any user may pass through, as ``/autograder`` is (pytest's temporary
    folder is not: only its owner may enter it), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
