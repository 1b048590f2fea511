"""A class with a hostile student in it: a submission that attacks the grading itself (the
other students' results and files, its own grading log, the grader's processes, the kit, the
summary) changes nothing but its own grade. The honest students' rows and results are those
of a clean run of the class without it, nothing is left running, nothing outside its scratch
changes; graded alone with the documented command, its grade is its own too."""
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from reference_impl.course.sandboxing import probe
from support.batch_checks import GRADE, PUBLIC_CHECKS, tiers
from support.leftovers import sleepers
from support import REPO, nested
from support.graded_cases import copy_of

# The first test's set-up grades two classes, one after the other: more than one test's time.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(probe() is not None, reason=f"no sandbox here: {probe()}")]

# The class is graded on fixed checks of lab 0 (support.batch_checks: the ring on a subgroup of
# 4 ranks, then the alpha-beta time in a helper); graded alone, the hostile submission is graded
# on lab 0's own public checks: the ring on 3 ranks, then the alpha-beta fit in a helper (not
# the hidden tier, tests/labs/hidden/, whose grading tests/course/test_grade_batch.py checks).
RING, HELPER = "ring_all_reduce_on_3_ranks", "fit_alpha_beta_recovers"
SELECTED = f"({RING} or {HELPER}) and not hidden"
SLEEP_MARK = "1000.375"  # what the hostile submission leaves running, if anything survives
ACCUMULATE = "chunks[receive_index] += received"
KIT_CONFTEST = REPO / "tests" / "labs" / "conftest.py"
KIT_MARKER = REPO / "reference_impl" / "course" / "zz_written_by_a_submission.py"

ATTACK = '''
import glob as _glob, os as _os, signal as _signal, subprocess as _subprocess


def _attack():
    for _path in _glob.glob({results!r} + "/**", recursive=True):  # the class's results
        if _os.path.isfile(_path):
            try:
                open(_path, "w").write("{{}}")
            except OSError:
                pass
    for _path in _glob.glob({submissions!r} + "/*/*.py"):  # the other students' files
        if "b_hostile" not in _path:
            try:
                open(_path, "a").write("\\nraise ImportError('edited by another student')\\n")
            except OSError:
                pass
    for _path in _glob.glob({temporary!r} + "/grad*/**/log.jsonl", recursive=True):  # its log
        try:
            open(_path, "a").write('{{"event": "finished", "exitstatus": 0}}\\n')
        except OSError:
            pass
    for _path in ["log.jsonl", *_glob.glob("../*/log.jsonl")]:  # through its working folder
        try:
            open(_path, "a").write('{{"event": "finished", "exitstatus": 0}}\\n')
        except OSError:
            pass
    for _path in _glob.glob("../*/labs/*.py"):  # the class's copies, the same way
        try:
            open(_path, "a").write("\\nraise ImportError('edited by another student')\\n")
        except OSError:
            pass
    for _path, _text in (({conftest!r}, "raise SystemExit\\n"), ({marker!r}, "")):  # the kit
        try:
            open(_path, "w").write(_text)
        except OSError:
            pass
    for _pid in _os.listdir("/proc"):  # the grader and its pytest, found by their commands
        try:
            _command = open(f"/proc/{{_pid}}/cmdline", "rb").read()
        except OSError:
            continue
        if b"reference_impl.course.grade" in _command or b"--grading-log" in _command:
            try:
                _os.kill(int(_pid), _signal.SIGKILL)
            except OSError:
                pass
    for _pid in (_os.getppid(), 1):
        try:
            _os.kill(_pid, _signal.SIGKILL)
        except OSError:
            pass
    _subprocess.Popen(["sleep", {sleep!r}], start_new_session=True)
    print("lab0: 2/2 passed", flush=True)


_attack()
'''


# Beside the same mistake: the reference's ring, loaded from its file past every import hook,
# and whatever of the grader's kit is in reach (the hidden checks, the kit's history), sent back.
PEEK = '''
import importlib.util as _util, os as _os

_kit = {kit!r}
_spec = _util.spec_from_file_location("_reference", _kit + "/reference_impl/comm/collectives.py")
_reference = _util.module_from_spec(_spec)
_spec.loader.exec_module(_reference)
ring_all_reduce = _reference.ring_all_reduce
for _path in (_kit + "/tests/labs/hidden/test_lab0_hidden.py", _kit + "/.git/HEAD"):
    if _os.path.exists(_path):
        raise RuntimeError("LEAKED " + open(_path).read()[:400])
'''
HIDDEN_SOURCE = REPO / "tests" / "labs" / "hidden" / "test_lab0_hidden.py"


HOG = """
_hog = []
while True:  # memory without end, at import
    _hog.append(bytearray(64 << 20))
"""


def make_class(root: Path, hostile: bool, results: Path) -> Path:
    """a_correct, c_mistake (a realistic mistake) and, if ``hostile``, b_hostile (the same
    mistake, and the attack at import), d_hog (memory without end at import) and e_peeker (the
    same mistake, and the reference's ring and the grader's kit sought at import)."""
    copy_of("solutions", root / "a_correct")
    if hostile:
        path = copy_of("solutions", root / "d_hog") / "collectives.py"
        path.write_text(path.read_text().replace("\nimport torch\n", f"\nimport torch\n{HOG}", 1))
    for name in ["c_mistake"] + (["b_hostile", "e_peeker"] if hostile else []):
        path = copy_of("solutions", root / name) / "collectives.py"
        text = path.read_text().replace(ACCUMULATE, ACCUMULATE.replace("+=", "="))
        if name == "b_hostile":
            attack = ATTACK.format(results=str(results), submissions=str(root),
                                   temporary=tempfile.gettempdir(), conftest=str(KIT_CONFTEST),
                                   marker=str(KIT_MARKER), sleep=SLEEP_MARK)
            text = text.replace("\nimport torch\n", f"\nimport torch\n{attack}\n", 1)
        if name == "e_peeker":
            text += PEEK.format(kit=str(REPO))
        path.write_text(text)
    return root


def grade_class(root: Path, out: Path) -> subprocess.CompletedProcess:
    checks = tiers(root.parent / f"{root.name}_checks", PUBLIC_CHECKS)
    command = [sys.executable, "-c", GRADE, *map(str, checks), str(root), "--labs", "0",
               "--out", str(out), "--jobs", "1", "--launch-timeout", "30",
               "--budget", "120", "--test-timeout", "60", "--memory-limit", "1.5"]
    return subprocess.run(command, cwd=root.parent, capture_output=True, text=True,
                          timeout=nested.LIMIT)


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def without_times(out: Path, name: str) -> tuple:
    """A submission's results.json and junit.xml, less the seconds they took."""
    result = json.loads((out / name / "results.json").read_text())
    result.pop("execution_time")
    suite = ElementTree.parse(out / name / "junit.xml").getroot()
    for element in suite.iter():
        element.attrib.pop("time", None)
    return result, ElementTree.tostring(suite)


def rows(out: Path) -> dict:
    with open(out / "grades.csv") as handle:
        return {row["submission"]: row for row in csv.DictReader(handle)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    hostile_out, clean_out = root / "hostile_results", root / "clean_results"
    hostile_class = make_class(root / "hostile_class", True, hostile_out)
    clean_class = make_class(root / "clean_class", False, clean_out)
    before = files_of(hostile_class)
    hostile = grade_class(hostile_class, hostile_out)
    time.sleep(0.5)
    left = sleepers(SLEEP_MARK)
    clean = grade_class(clean_class, clean_out)
    yield dict(hostile=hostile, clean=clean, hostile_out=hostile_out, clean_out=clean_out,
               changed=before != files_of(hostile_class), left=left,
               kit=[path for path in (KIT_CONFTEST, KIT_MARKER) if path.exists()])
    for path in (KIT_CONFTEST, KIT_MARKER):
        path.unlink(missing_ok=True)


def test_the_honest_rows_and_results_are_those_of_a_clean_run(graded):
    assert graded["hostile"].returncode == graded["clean"].returncode == 0, \
        graded["hostile"].stdout + graded["hostile"].stderr
    hostile, clean = rows(graded["hostile_out"]), rows(graded["clean_out"])
    assert set(hostile) == {"a_correct", "b_hostile", "c_mistake", "d_hog", "e_peeker"}
    for name in ("a_correct", "c_mistake"):
        assert hostile[name] == clean[name], (hostile[name], clean[name])
        assert without_times(graded["hostile_out"], name) == without_times(
            graded["clean_out"], name), name
    assert clean["a_correct"]["passed"] == "2" and clean["c_mistake"]["passed"] == "1"


def test_the_hostile_submission_gets_its_own_grade(graded):
    row = rows(graded["hostile_out"])["b_hostile"]
    assert (row["passed"], row["total"]) == ("1", "2"), row  # its mistake, nothing more
    result = json.loads((graded["hostile_out"] / "b_hostile" / "results.json").read_text())
    ring = next(test for test in result["tests"] if "subgroup" in test["name"])
    assert ring["status"] == "failed" and "likely cause" in ring["output"].lower(), ring


def test_a_submission_that_seeks_the_reference_and_the_kit_gets_its_mistake_s_grade(graded):
    """The graded lab's module reads as its stub, whatever way it is loaded; the hidden checks
    and the kit's history are not in reach of its code."""
    row = rows(graded["hostile_out"])["e_peeker"]
    assert (row["passed"], row["total"]) == ("1", "2"), row  # its mistake, nothing more
    hidden_start = HIDDEN_SOURCE.read_text()[:60]
    for path in graded["hostile_out"].rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "LEAKED" not in text and hidden_start not in text, path
    ring = next(test for test in json.loads((graded["hostile_out"] / "e_peeker" / "results.json")
                                            .read_text())["tests"] if "subgroup" in test["name"])
    assert "NotImplementedError: lab0: ring_chunks" in ring["output"], ring["output"]


def test_memory_without_end_is_stopped_at_the_limit(graded):
    row = rows(graded["hostile_out"])["d_hog"]
    assert (row["passed"], row["total"]) == ("1", "2"), row  # its alpha_beta is right
    result = json.loads((graded["hostile_out"] / "d_hog" / "results.json").read_text())
    ring = next(test for test in result["tests"] if "subgroup" in test["name"])
    assert "MemoryError" in ring["output"], ring["output"]


def test_nothing_is_left_running_and_nothing_outside_its_scratch_changed(graded):
    assert not graded["left"], f"left running: {graded['left']}"
    assert not graded["changed"], "the class's submissions changed"
    assert not graded["kit"], f"written into the kit: {graded['kit']}"


def test_the_grader_says_which_sandbox_it_ran_in(graded):
    assert "sandbox: namespaces" in graded["hostile"].stdout


def test_one_submission_graded_alone_gets_its_own_grade(tmp_path):
    folder = make_class(tmp_path / "class", True, tmp_path / "results") / "b_hostile"
    log = tmp_path / "log.jsonl"
    run = subprocess.run([sys.executable, "-m", "pytest", "--impl", str(folder), "-m", "lab0",
                          "-k", SELECTED, "-p", "no:cacheprovider", "--grading-log", str(log)],
                         cwd=REPO, capture_output=True, text=True, timeout=nested.LIMIT)
    kit = [path for path in (KIT_CONFTEST, KIT_MARKER) if path.exists()]
    for path in kit:
        path.unlink()
    assert not kit, f"written into the kit: {kit}"
    assert run.returncode == 1, run.stdout + run.stderr
    summary = run.stdout.split("graded labs (")[1]
    assert "\nlab0: 1/2 passed" in summary, summary
    # Its own summary line is printed as the rank's output, marked as such.
    assert "\nlab0: 2/2 passed" not in run.stdout and "| lab0: 2/2 passed" in run.stdout
    assert "sandbox: namespaces" in summary and "budget: 900 s" in summary
    assert not sleepers(SLEEP_MARK)


def test_sigterm_ends_a_graded_run_with_its_summary(tmp_path):
    folder = copy_of("solutions", tmp_path / "correct")
    log = tmp_path / "log.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "pytest", "--impl", str(folder), "-m",
                                "lab0", "-p", "no:cacheprovider", "--grading-log", str(log)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and '"event": "report"' not in (
            log.read_text() if log.exists() else ""):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    output = process.communicate(timeout=60)[0]
    summary = output.split("graded labs (")[-1]
    assert "interrupted: the graded run received SIGTERM" in summary, output[-3000:]
    assert "not run)" in summary, summary  # each lab's progress, what was not run counted
