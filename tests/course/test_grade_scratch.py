"""A graded run's scratch is a folder of its own, bounded in size and in files, where the grader
may make one (as root, or as another user in a user namespace of its own): what a submission
writes there cannot fill the machine's disk, and it is gone with the run."""
import os
import subprocess
import sys

import pytest

from reference_impl.comm.user_box import BOX_UID
from reference_impl.course.grade import running
from reference_impl.course.grade.scratch import SCRATCH_BYTES, SCRATCH_FILES
from support.box_user import ROOT_ON_LINUX, open_to_a_box_user, reachable_folder

# Root runs it as root, and as another user (the box user's uid stands in for a grader's).
pytestmark = pytest.mark.skipif(not ROOT_ON_LINUX, reason="the test takes root, to run it as "
                                                           "root and as another user")

FILL = """
import os, sys
folder = sys.argv[1]
try:
    with open(os.path.join(folder, "tmp", "big"), "wb") as handle:
        for _ in range(12):
            handle.write(b"x" * (1 << 20))
    print("wrote 12 MiB")
except OSError as error:
    print("big:", error.strerror)
made = 0
try:
    for index in range(200):
        open(os.path.join(folder, f"file{index}"), "w").close()
        made += 1
except OSError as error:
    print(f"files: {made}:", error.strerror)
"""


@pytest.mark.parametrize("user", [0, BOX_UID], ids=["as root", "as another user"])
def test_the_scratch_holds_its_bytes_and_files_and_nothing_outlives_the_run(user):
    with reachable_folder("scratch") as base, open_to_a_box_user():
        folder = base / "scratch"
        folder.mkdir()
        os.chown(folder, user, user)
        run = subprocess.run([sys.executable, "-m", "reference_impl.course.grade.scratch",
                              str(folder), str(8 << 20), "100", "--", sys.executable, "-c", FILL,
                              str(folder)], capture_output=True, text=True, timeout=60,
                             user=user, group=user, extra_groups=[], cwd=base)
        assert run.returncode == 0, run.stderr
        assert "big: No space left on device" in run.stdout, run.stdout
        assert "files: " in run.stdout and "No space left on device" in run.stdout, run.stdout
        assert list(folder.iterdir()) == []  # the run's files were in its own tmpfs


def test_the_batch_grader_runs_pytest_in_a_bounded_scratch(tmp_path):
    command = running.graded_run_command(tmp_path, ["lab0"], tmp_path / "log", tmp_path / "ini",
                                         tmp_path / "scratch", running.Limits())
    separator = command.index("--")
    assert command[1:separator] == ["-m", "reference_impl.course.grade.scratch",
                                    str(tmp_path / "scratch"), str(SCRATCH_BYTES),
                                    str(SCRATCH_FILES)]
    assert command[separator + 1:separator + 4] == [sys.executable, "-m", "pytest"]
    assert command[command.index("--basetemp") + 1] == str(tmp_path / "scratch" / "pytest")
