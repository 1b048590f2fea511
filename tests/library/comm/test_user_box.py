"""A launch as a box user (reference_impl/comm/user_box.py), the sandbox where no namespace can
be made: it runs as its own unprivileged user, reads nothing the caller closed, owns only its
folders (never a file a link it left points to), is held by the process limit that does not
hold for root, and leaves nothing running."""
import os
import subprocess
import sys
import time

import pytest

from reference_impl.comm.launcher import launch
from reference_impl.comm.sandbox import Sandbox, processes_of
from reference_impl.comm.user_box import BOX_UID
from support.box_user import needs_root, open_to_a_box_user, reachable_folder

pytestmark = needs_root


@pytest.fixture(autouse=True)
def reachable():
    with open_to_a_box_user():
        yield


@pytest.fixture
def folders():
    """A closed folder with a secret, an open one, a writable one, and a root file beside them,
    under a folder any user may pass through (pytest's own is closed to them)."""
    with reachable_folder("box") as base:
        for name in ("closed", "open", "writable"):
            (base / name).mkdir()
            (base / name / "file").write_text(name)
        (base / "closed").chmod(0o755)  # the box closes it
        (base / "root_file").write_text("root's")
        (base / "root_file").chmod(0o600)
        yield base


def boxed(fn, *args, folders, world_size=1, **options):
    sandbox = Sandbox(uid=BOX_UID, hidden=(str(folders / "closed"),),
                      readable=(str(folders / "open"),), writable=(str(folders / "writable"),),
                      **options)
    return launch(fn, world_size, *args, sandbox=sandbox, timeout=60.0, results="data")


def look(base: str) -> dict:
    seen = {"uid": os.getuid()}
    for name in ("closed/file", "open/file", "root_file"):
        try:
            with open(os.path.join(base, name)) as handle:
                seen[name] = handle.read()
        except OSError as error:
            seen[name] = type(error).__name__
    for name in ("writable/mine", "open/mine"):
        try:
            with open(os.path.join(base, name), "w") as handle:
                handle.write("x")
            seen[name] = "written"
        except OSError as error:
            seen[name] = type(error).__name__
    try:
        os.setuid(0)
        seen["root again"] = True
    except OSError:
        seen["root again"] = False
    return seen


def test_a_box_user_reads_only_what_is_open_and_writes_only_its_folders(folders):
    seen = boxed(look, str(folders), folders=folders, world_size=2)
    assert seen[0] == seen[1] == {
        "uid": BOX_UID, "closed/file": "PermissionError", "open/file": "open",
        "root_file": "PermissionError", "writable/mine": "written",
        "open/mine": "PermissionError", "root again": False}


def leave_a_link(base: str) -> None:
    os.symlink(os.path.join(base, "root_file"), os.path.join(base, "writable", "link"))


def test_a_link_the_box_user_leaves_is_never_followed(folders):
    boxed(leave_a_link, str(folders), folders=folders)
    boxed(look, str(folders), folders=folders)  # its folders given to it again
    assert (folders / "root_file").stat().st_uid == 0
    assert (folders / "root_file").stat().st_mode & 0o777 == 0o600


def leave_running() -> None:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                     start_new_session=True)
    time.sleep(0.2)


def test_what_a_box_user_leaves_running_ends_with_its_launch(folders):
    boxed(leave_running, folders=folders)
    assert processes_of(BOX_UID, running_only=True) == 0


def fork_many(most: int) -> int:
    started = 0
    for _ in range(most):
        try:
            if os.fork() == 0:
                time.sleep(5)
                os._exit(0)
        except OSError:
            break
        started += 1
    return started


def test_the_process_limit_holds_for_a_box_user(folders):
    started = boxed(fork_many, 200, folders=folders, processes=20)[0]
    assert started <= 20, f"a box user limited to 20 processes started {started}"
