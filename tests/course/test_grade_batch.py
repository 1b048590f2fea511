"""Batch grading (``python -m reference_impl.course.grade``) on a class of submissions that
includes every kind of misbehaviour: each is contained within its limits, reported against
its submission with a clear reason, leaves nothing running, and the others are graded
normally (correct > realistic mistake > stubs).

One batch run (lab 0, three of its tests, short limits) serves every test here."""
import csv
import json
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from support.leftovers import sleepers
from support import nested
from reference_impl.course import make_labs
from reference_impl.course.sandboxing import probe
from support import REPO

pytestmark = pytest.mark.slow

SELECTED = "subgroup or 2-5e-05"  # a test on 4 ranks, then one in a helper process
LAUNCH_TIMEOUT, AFTER_HANG, BUDGET = 4.0, 1.0, 40.0
SLEEP_MARK = "1000.25"  # `sleep 1000.25`: what the noisy submission leaves running, if anything

ACCUMULATE = "chunks[receive_index] += received"


def submission(folder: Path, edit=None, files="solutions") -> Path:
    """A copy of every student file (the stubs, or the reference they come from), then
    ``edit(text of collectives.py)``."""
    folder.mkdir(parents=True)
    for module in make_labs.modules_with_exercises():
        source = REPO / "labs" / module.name if files == "stubs" else module
        shutil.copy(source, folder / module.name)
    if edit is not None:
        path = folder / "collectives.py"
        path.write_text(edit(path.read_text()))
    return folder


def at_import(code):
    return lambda text: text.replace("\nimport torch\n", f"\nimport torch\n{code}\n", 1)


def in_ring_all_reduce(code):
    marker = '    """Sum ``tensor`` over the group, in place, with the two ring phases; returns it."""\n'
    return lambda text: text.replace(marker, marker + code, 1)


CHEAT = """
import pytest as _pytest
torch.allclose = lambda *args, **kwargs: True
_pytest.approx = lambda expected, *args, **kwargs: _Anything()


class _Anything:
    def __eq__(self, other):
        return True


class _Evil:
    def __reduce__(self):
        return (open, ({marker!r}, "w"))

    def cpu(self):
        return self
"""


def build_class(root: Path, marker: Path) -> Path:
    """The class: a correct submission, the stubs, a realistic mistake, and three that
    misbehave, each in several ways that different tests here look at."""
    submission(root / "correct")
    submission(root / "stubs", files="stubs")
    submission(root / "mistake", lambda text: text.replace(ACCUMULATE, ACCUMULATE.replace(
        "+=", "=")))
    # Cheats: always-true comparisons at import, a real mistake, a result whose unpickling
    # would run its code, a process started at import, 50 MB printed per call, and the
    # reference's alpha_beta re-exported.
    cheats = submission(root / "cheats", lambda text: in_ring_all_reduce(
        "    print('x' * 50_000_000, flush=True)\n    return _Evil()\n")(at_import(
            CHEAT.format(marker=str(marker))
            + f"import subprocess\nsubprocess.Popen(['sleep', '{SLEEP_MARK}'])")(text)))
    (cheats / "alpha_beta.py").write_text("from reference_impl.comm.alpha_beta import *\n")
    submission(root / "kills_parent", at_import(
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"))
    # Hangs: a deadlock (only rank 0 calls the all-reduce) and an endless loop at import.
    hangs = submission(root / "hangs", in_ring_all_reduce(
        "    if dist.get_rank() == 0:\n        dist.all_reduce(torch.ones(1))\n"))
    path = hangs / "alpha_beta.py"
    path.write_text(at_import("while True:\n    pass")(path.read_text()))
    # One the grader itself cannot handle: a student file that is a link to nowhere.
    (submission(root / "unreadable") / "zz_notes.py").symlink_to(root / "nowhere.py")
    return root


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    marker = root / "evil_code_ran"
    submissions = build_class(root / "submissions", marker)
    out = root / "results"
    command = [sys.executable, "-m", "reference_impl.course.grade", str(submissions),
               "--labs", "0", "--out", str(out), "-k", SELECTED, "--jobs", "2",
               "--launch-timeout", str(LAUNCH_TIMEOUT), "--after-hang", str(AFTER_HANG),
               "--budget", str(BUDGET), "--test-timeout", "30"]
    started = time.monotonic()
    process = subprocess.run(command, cwd=root, capture_output=True, text=True,
                             timeout=nested.LIMIT)
    seconds = time.monotonic() - started
    time.sleep(0.5)  # SIGKILL is delivered asynchronously
    results = {path.name: json.loads((path / "results.json").read_text())
               for path in out.iterdir() if path.is_dir()}
    with open(out / "grades.csv") as handle:
        sheet = {row["submission"]: row for row in csv.DictReader(handle)}
    return dict(process=process, results=results, sheet=sheet, out=out, marker=marker,
                seconds=seconds, left=sleepers(SLEEP_MARK))


def failures(result) -> str:
    return "\n".join(test["output"] for test in result["tests"] if test["status"] == "failed")


def test_every_submission_is_graded_and_the_sheet_written(graded):
    assert set(graded["sheet"]) == set(graded["results"]) == {
        "correct", "stubs", "mistake", "cheats", "kills_parent", "hangs", "unreadable"}
    assert "Most common failures" in (graded["out"] / "report.md").read_text()
    assert "[1/7]" in graded["process"].stdout  # progress while it runs


def test_a_grading_that_raises_is_an_errored_row_and_fails_the_command(graded):
    """The grader's own failure on one submission neither drops its row nor stops the class."""
    assert graded["process"].returncode == 1, graded["process"].stdout + graded["process"].stderr
    row = graded["sheet"]["unreadable"]
    assert row["notes"].startswith("the grading raised FileNotFoundError"), row
    assert "Traceback" in graded["results"]["unreadable"]["output"]
    assert "Grading raised: unreadable." in (graded["out"] / "report.md").read_text()
    assert graded["sheet"]["correct"]["passed"] == "2"  # the others graded as usual


def test_correct_beats_mistake_beats_stubs(graded):
    score = {name: float(row["score"]) for name, row in graded["sheet"].items()}
    assert graded["sheet"]["correct"]["passed"] == graded["sheet"]["correct"]["total"] == "2"
    assert score["correct"] == 2 > score["mistake"] > score["stubs"] == 0, score
    assert "NotImplementedError" in failures(graded["results"]["stubs"])
    assert "likely cause" in failures(graded["results"]["mistake"]).lower()
    assert not graded["results"]["correct"]["output"]  # nothing flagged, nothing hung


def test_gradescope_and_junit_files(graded):
    result = graded["results"]["mistake"]
    assert {"score", "tests"} <= set(result)
    assert all({"name", "score", "max_score", "output"} <= set(test) for test in result["tests"])
    assert result["score"] == sum(test["score"] for test in result["tests"]) == 1
    suite = ElementTree.parse(graded["out"] / "mistake" / "junit.xml").getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")


def test_a_reexport_of_the_reference_is_flagged_and_scores_nothing(graded):
    result = graded["results"]["cheats"]
    assert graded["sheet"]["cheats"]["flags"].startswith("lab0: alpha_beta.py line 1 imports "
                                                         "reference_impl.comm.alpha_beta")
    assert result["score"] == 0
    assert any(test["name"].startswith("flagged") for test in result["tests"])


def test_a_submission_cannot_grade_itself(graded):
    # Always-true torch.allclose and pytest.approx have no effect where the verdict is
    # reached; the object is refused as not data, without being rebuilt.
    result = graded["results"]["cheats"]
    ring = next(test for test in result["tests"] if "subgroup" in test["name"])
    assert ring["status"] == "failed" and "not data" in ring["output"]
    assert not graded["marker"].exists()


def test_processes_a_submission_starts_are_ended_and_its_output_capped(graded):
    assert not graded["left"], f"left running: {graded['left']}"
    assert len(json.dumps(graded["results"]["cheats"])) < 50_000  # it printed 200 MB


def test_a_rank_that_kills_its_parent_changes_nothing_or_is_reported(graded):
    """In the sandbox a rank's parent is its namespace's first process, which nothing inside
    can kill: the submission is graded as if it had not tried. Without a sandbox the rank
    server dies, and the result says so."""
    result = graded["results"]["kills_parent"]
    if probe() is None:
        assert result["score"] == 2 and not failures(result), failures(result)
    else:
        assert result["score"] == 1  # its alpha_beta (a helper's test) is right
        assert "parent process, was killed" in failures(result)


def test_a_hang_costs_one_time_limit_and_is_reported_as_such(graded):
    result = graded["results"]["hangs"]
    assert "hung" in result["output"] and graded["sheet"]["hangs"]["notes"].startswith("hung")
    first, second = (test["output"] for test in result["tests"])
    assert f"did not finish within {LAUNCH_TIMEOUT:g} s" in first
    assert f"did not finish within {AFTER_HANG:g} s" in second and "already hung" in second
    assert result["score"] == 0
