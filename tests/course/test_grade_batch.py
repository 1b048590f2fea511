"""Batch grading (``python -m reference_impl.course.grade``) on a class of submissions that
includes every kind of misbehaviour: each is contained within its limits, reported against
its submission with a clear reason, leaves nothing running, and the others are graded
normally (correct > realistic mistake > stubs). The hidden tier is graded with the public one,
shown on Gradescope after the due date and counted apart.

Both batch runs here grade lab 0 on graded checks of their own (``support.batch_checks``), so
that they do not change as lab 0's tests do: one run of the whole class on two public checks,
with short limits, serves the tests of misbehaviour; one of a single submission with a hidden
tier, the tests of the two tiers."""
import csv
import json
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from support.batch_checks import GRADE, PUBLIC_CHECKS, tiers
from support.leftovers import sleepers
from support import nested
from reference_impl.course import make_labs
from reference_impl.course.grade import cli
from reference_impl.course.grade.results import Graded
from reference_impl.course.sandboxing import probe
from support import REPO

pytestmark = pytest.mark.slow

LAUNCH_TIMEOUT, AFTER_HANG, BUDGET = 4.0, 1.0, 40.0
# The batch grader refuses to grade unsandboxed unless asked: where no sandbox can be made, ask.
SANDBOX = [] if probe() is None else ["--sandbox", "none"]
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
    """The class: a correct submission, the stubs, a realistic mistake, and those that
    misbehave, each in several ways that different tests here look at."""
    submission(root / "correct")
    submission(root / "stubs", files="stubs")
    submission(root / "mistake", lambda text: text.replace(ACCUMULATE, ACCUMULATE.replace(
        "+=", "=")))
    # Cheats: always-true comparisons at import, a real mistake, a result whose unpickling
    # would run its code, a process started at import, 50 MB printed per call.
    submission(root / "cheats", lambda text: in_ring_all_reduce(
        "    print('x' * 50_000_000, flush=True)\n    return _Evil()\n")(at_import(
            CHEAT.format(marker=str(marker))
            + f"import subprocess\nsubprocess.Popen(['sleep', '{SLEEP_MARK}'])")(text)))
    # The reference's alpha_beta re-exported: flagged; in the ranks, the reference's name is
    # the submission's own file (the student's view), so it re-exports nothing.
    reexports = submission(root / "reexports")
    (reexports / "alpha_beta.py").write_text("from reference_impl.comm.alpha_beta import *\n")
    submission(root / "kills_parent", at_import(
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"))
    # Hangs: a deadlock (only rank 0 calls the all-reduce) and an endless loop at import.
    hangs = submission(root / "hangs", in_ring_all_reduce(
        "    if dist.get_rank() == 0:\n        dist.all_reduce(torch.ones(1))\n"))
    path = hangs / "alpha_beta.py"
    path.write_text(at_import("while True:\n    pass")(path.read_text()))
    # One with a student file that is a link (to nowhere): refused, its other files graded.
    (submission(root / "linked") / "zz_notes.py").symlink_to(root / "nowhere.py")
    return root


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    marker = root / "evil_code_ran"
    submissions = build_class(root / "submissions", marker)
    out = root / "results"
    command = [sys.executable, "-c", GRADE, *map(str, tiers(root / "checks", PUBLIC_CHECKS)),
               str(submissions), "--labs", "0", "--out", str(out), "--jobs", "2",
               "--launch-timeout", str(LAUNCH_TIMEOUT), "--after-hang", str(AFTER_HANG),
               "--budget", str(BUDGET), "--test-timeout", "30", *SANDBOX]
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
        "correct", "stubs", "mistake", "cheats", "reexports", "kills_parent", "hangs", "linked"}
    assert "Most common failures" in (graded["out"] / "report.md").read_text()
    assert "[1/8]" in graded["process"].stdout  # progress while it runs


def test_a_file_that_is_a_link_is_refused_in_its_row_and_the_rest_graded(graded):
    """A link among a submission's files is neither followed nor an error of the grader's: its
    row names it, and its other files are graded as usual."""
    assert graded["process"].returncode == 0, graded["process"].stdout + graded["process"].stderr
    row = graded["sheet"]["linked"]
    note = "refused 1 file(s): zz_notes.py (a symbolic link: only regular files are graded)"
    assert row["notes"] == note and row["passed"] == row["total"] == "2", row
    assert note in graded["results"]["linked"]["output"]
    assert "Grading raised: none." in (graded["out"] / "report.md").read_text()


def test_a_grading_that_raises_is_an_errored_row_and_fails_the_command(tmp_path, monkeypatch):
    """The grader's own failure on one submission neither drops its row nor stops the class."""
    def grade_one(submission, *rest):
        if submission.name == "breaks_the_grader":
            raise RuntimeError("a bug of the grader's own")
        return Graded(submission.name, [], [], [], 0.0)

    monkeypatch.setattr(cli, "grade_one", grade_one)
    monkeypatch.setattr(cli, "Reaper", lambda: None)  # not this process: it grades no one here
    for name in ("breaks_the_grader", "correct"):
        (tmp_path / "submissions" / name).mkdir(parents=True)
    out = tmp_path / "results"
    assert cli.main([str(tmp_path / "submissions"), "--labs", "0", "--out", str(out),
                     "--sandbox", "none"]) == 1
    with open(out / "grades.csv") as handle:
        sheet = {row["submission"]: row for row in csv.DictReader(handle)}
    assert set(sheet) == {"breaks_the_grader", "correct"}
    assert sheet["breaks_the_grader"]["notes"] == ("the grading raised RuntimeError: a bug of the "
                                                   "grader's own"), sheet
    result = json.loads((out / "breaks_the_grader" / "results.json").read_text())
    assert "Traceback" in result["output"]
    assert "Grading raised: breaks_the_grader." in (out / "report.md").read_text()


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
    result = graded["results"]["reexports"]
    assert graded["sheet"]["reexports"]["flags"].startswith(
        "lab0: alpha_beta.py line 1 imports reference_impl.comm.alpha_beta")
    assert result["score"] == 0
    assert any(test["name"].startswith("flagged") for test in result["tests"])
    if probe() is None:  # in the sandbox, the reference's name is the submission's own file
        assert "from 'alpha_beta' (labs/alpha_beta.py)" in failures(result), failures(result)


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


# ------------------------------------------------------------ the two tiers: public and hidden

HIDDEN_CHECKS = """import pytest

pytestmark = pytest.mark.lab0


def test_tier_check_on_another_seed():
    pass


def test_tier_check_on_another_layout():
    assert False, "lab0: the sum differs on the strided layout"
"""


@pytest.fixture(scope="module")
def graded_tiers(tmp_path_factory):
    """A class of one graded on the public ring time (a helper process) and a hidden tier of two
    checks, one passing and one failing; lab 0 is worth 6 points, 2 a test."""
    root = tmp_path_factory.mktemp("tiers")
    (root / "points.json").write_text(json.dumps({"labs": {"lab0": 6}}))
    submission(root / "submissions" / "correct")
    out = root / "results"
    process = subprocess.run(
        [sys.executable, "-c", GRADE, *map(str, tiers(root / "checks", PUBLIC_CHECKS,
                                                      HIDDEN_CHECKS)),
         str(root / "submissions"), "--labs", "0", "--out", str(out), "-k",
         "ring_time or tier_check", "--points", str(root / "points.json"), "--test-timeout", "30",
         *SANDBOX],
        cwd=root, capture_output=True, text=True, timeout=nested.LIMIT)
    assert process.returncode == 0, process.stdout + process.stderr
    with open(out / "grades.csv") as handle:
        row, = csv.DictReader(handle)
    return dict(process=process, row=row, out=out,
                result=json.loads((out / "correct" / "results.json").read_text()))


def test_hidden_checks_are_run_by_the_grader_after_the_public_ones(graded_tiers):
    names = [test["name"] for test in graded_tiers["result"]["tests"]]
    assert len(names) == 3 and names[0].startswith("test_lab0_"), names
    assert names[1:] == ["test_lab0_hidden.py::test_tier_check_on_another_seed",
                         "test_lab0_hidden.py::test_tier_check_on_another_layout"], names
    failed = graded_tiers["result"]["tests"][2]
    assert failed["status"] == "failed" and "differs on the strided layout" in failed["output"]
    assert "lab0 2/3 (4/6; hidden 1/2)" in graded_tiers["process"].stdout, graded_tiers["process"].stdout


def test_hidden_checks_are_shown_on_gradescope_after_the_due_date(graded_tiers):
    visibility = [test["visibility"] for test in graded_tiers["result"]["tests"]]
    assert visibility == ["visible", "after_due_date", "after_due_date"], visibility
    assert graded_tiers["result"]["score"] == 4


def test_hidden_checks_are_counted_apart_in_the_sheet_junit_and_report(graded_tiers):
    row = graded_tiers["row"]
    points = {column: float(row[column]) for column in (
        "score", "max_score", "public_score", "public_max", "hidden_score", "hidden_max")}
    assert points == {"score": 4, "max_score": 6, "public_score": 2, "public_max": 2,
                      "hidden_score": 2, "hidden_max": 4}, row
    assert (row["passed"], row["total"], row["hidden_passed"], row["hidden_total"]) == (
        "2", "3", "1", "2"), row
    suite = ElementTree.parse(graded_tiers["out"] / "correct" / "junit.xml").getroot()
    assert [case.get("classname") for case in suite] == [
        "correct.lab0", "correct.lab0.hidden", "correct.lab0.hidden"]
    report = (graded_tiers["out"] / "report.md").read_text()
    assert "| 1 | `test_lab0_hidden.py::test_tier_check_on_another_layout` (hidden) |" in report
