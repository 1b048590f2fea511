"""The Gradescope autograder (reference_impl/course/grade/gradescope), built with the documented
command and run as Gradescope runs it: its zip unpacked into a root laid out as ``/autograder``
(``source/``, ``submission/``, ``results/``), ``run_autograder`` run with that root. A solved
submission gets full marks with the hidden checks shown after the due date; a partial one gets
what the batch grader gives it; a hostile one, in the kit's sandbox and as a box user (no
namespaces), reads neither the hidden checks nor a solution, and its results are the grader's
even though it wrote its own, also from a process it left running."""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from reference_impl.comm.sandbox import processes_of
from reference_impl.comm.user_box import BOX_UID
from reference_impl.comm.user_box import unavailable as no_box_user
from reference_impl.course import make_labs
from reference_impl.course.sandboxing import probe
from support import REPO
from support.box_user import needs_root, open_to_a_box_user, reachable_folder

pytestmark = pytest.mark.slow

BUILD = "python -m reference_impl.course.grade.gradescope --labs 0 --out autograder.zip"
LIMIT = 300  # seconds a grading of lab 0 may take here
HIDDEN_MARK = "SEED_OFFSET = 7919"  # a line of lab 0's hidden checks
SOLUTION = re.compile(r"^\s*# BEGIN SOLUTION lab\d", re.MULTILINE)  # a solution's first line
WRONG = '''

def ring_all_reduce_seconds(nbytes, n, alpha, bandwidth):
    raise ValueError("wrong" + found())


def found():
    return ""
'''
# What a hostile student adds: at import, results written by itself and by a process left
# running; when its function is called, what it could read of the hidden checks and of any
# solution, returned in the failure message.
HOSTILE = r'''

import glob as _glob
import re as _re
import subprocess as _subprocess
import sys as _sys

_ROOT = {root!r}
_FORGE = (
    "import json, time\n"
    "for _ in range({rounds}):\n"
    "    for name in ('results.json', 'forged.json'):\n"
    "        try:\n"
    "            with open(" + repr(_ROOT) + " + '/results/' + name, 'w') as handle:\n"
    "                json.dump({{'score': 1000, 'tests': [], 'output': 'forged'}}, handle)\n"
    "        except OSError:\n"
    "            pass\n"
    "    time.sleep(0.1)\n")
exec(_FORGE.replace("range({rounds})", "range(1)"))  # now, and from a process left running
_subprocess.Popen([_sys.executable, "-c", _FORGE], start_new_session=True,
                  stdout=_subprocess.DEVNULL, stderr=_subprocess.DEVNULL)


def found():
    seen = []
    for pattern, mark in ((_ROOT + "/source/kit/tests/labs/hidden/*.py", ""),
                          (_ROOT + "/source/kit/**/*.py", _re.compile(r"^\s*# BEGIN SOLUTION lab\d", _re.M)),
                          (_ROOT + "/results/*", ""), (_ROOT + "/submission_metadata.json", "")):
        mark = _re.compile(_re.escape(mark)) if isinstance(mark, str) else mark
        for path in _glob.glob(pattern, recursive=True):
            try:
                with open(path, errors="replace") as handle:
                    text = handle.read()
            except OSError:
                continue
            if mark.search(text):
                seen.append(path + ": " + text[:2000])
    return " LEAKED " + " ".join(seen) if seen else ""
'''


def solved(folder: Path) -> None:
    folder.mkdir(parents=True)
    for module in make_labs.modules_with_exercises():
        shutil.copy(module, folder / module.name)


def with_mistake(folder: Path, added: str) -> None:
    solved(folder)
    with open(folder / "alpha_beta.py", "a") as handle:
        handle.write(added)


@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("build")
    process = subprocess.run(BUILD, shell=True, cwd=folder, capture_output=True, text=True,
                             timeout=LIMIT, env={**os.environ, "PATH": f"{Path(sys.executable).parent}"
                                                 f"{os.pathsep}{os.environ['PATH']}"})
    assert process.returncode == 0, process.stderr
    assert "Gradescope container: at least 1 CPU and 1.5 GB" in process.stdout
    return folder / "autograder.zip"


@pytest.fixture
def roots():
    """Folders for roots laid out as ``/autograder``, reached by any user as that one is."""
    with contextlib.ExitStack() as made:
        yield lambda name: made.enter_context(reachable_folder(f"autograder-{name}"))


def container(autograder: Path, root: Path, make_submission) -> Path:
    """A root laid out as Gradescope's ``/autograder`` (its results folder made, open, as
    Gradescope makes it), the zip in ``source``, the kit's own Python standing in for the
    environment ``setup.sh`` makes."""
    with zipfile.ZipFile(autograder) as archive:
        archive.extractall(root / "source")
        for entry in archive.infolist():
            os.chmod(root / "source" / entry.filename, entry.external_attr >> 16 & 0o777)
    (root / "venv" / "bin").mkdir(parents=True)
    python = root / "venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    make_submission(root / "submission")
    (root / "submission_metadata.json").write_text('{"users": [{"name": "A Student"}]}\n')
    (root / "results").mkdir(mode=0o755)
    return root


def run_autograder(root: Path, sandbox: str = "auto") -> dict:
    environment = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_SANDBOX": sandbox}
    process = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=environment,
                             capture_output=True, text=True, timeout=LIMIT)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def test_the_zip_holds_the_scripts_the_settings_and_no_solution(autograder, tmp_path):
    with zipfile.ZipFile(autograder) as archive:
        names = archive.namelist()
        modes = {entry.filename: entry.external_attr >> 16 for entry in archive.infolist()}
        settings = json.loads(archive.read("autograder.json"))
        kit_text = {name: archive.read(name).decode(errors="replace") for name in names
                    if name.startswith("kit/") and name.endswith(".py")}
        archive.extract("setup.sh", tmp_path)
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    assert settings["labs"] == ["lab0"] and settings["container"]["cpus"] >= 1
    assert settings["labs"] and "measured_on" in settings
    assert not [name for name, text in kit_text.items() if SOLUTION.search(text)]
    assert sorted(name for name in names if "/hidden/" in name) == [
        "kit/tests/labs/hidden/conftest.py", "kit/tests/labs/hidden/test_lab0_hidden.py"]
    assert subprocess.run(["bash", "-n", str(tmp_path / "setup.sh")]).returncode == 0


@pytest.mark.skipif(probe() is not None and no_box_user() is not None,
                    reason="neither namespaces nor a box user can be made here")
def test_a_solved_submission_gets_full_marks_and_the_hidden_checks_after_the_due_date(
        autograder, roots):
    results = run_autograder(container(autograder, roots("solved"), solved))
    assert results["score"] == sum(test["max_score"] for test in results["tests"]) > 0
    hidden = [test for test in results["tests"] if "hidden" in test["name"]]
    assert hidden and {test["visibility"] for test in hidden} == {"after_due_date"}
    assert {test["visibility"] for test in results["tests"] if test not in hidden} == {"visible"}
    assert results["output"].startswith("sandbox: ")


@pytest.mark.skipif(probe() is not None, reason=f"no sandbox here ({probe()}): the batch grader "
                                               "refuses to grade without one")
def test_a_partial_submission_gets_what_the_batch_grader_gives_it(autograder, roots, tmp_path):
    results = run_autograder(container(autograder, roots("partial"),
                                       lambda folder: with_mistake(folder, WRONG)))
    with_mistake(tmp_path / "class" / "student", WRONG)
    subprocess.run([sys.executable, "-m", "reference_impl.course.grade", str(tmp_path / "class"),
                    "--labs", "0", "--out", str(tmp_path / "out")], cwd=REPO, check=True,
                   capture_output=True, timeout=LIMIT)
    batch = json.loads((tmp_path / "out" / "student" / "results.json").read_text())
    assert 0 < results["score"] == batch["score"] < sum(t["max_score"] for t in batch["tests"])
    assert results["tests"] == batch["tests"]


MODES = [pytest.param("namespaces", marks=pytest.mark.skipif(
             probe() is not None, reason=f"no namespaces here: {probe()}")),
         pytest.param("user", marks=needs_root)]


@pytest.fixture
def reachable(sandbox):
    with open_to_a_box_user() if sandbox == "user" else contextlib.nullcontext():
        yield


@pytest.mark.parametrize("sandbox", MODES)
def test_a_hostile_submission_reads_nothing_and_writes_no_result(autograder, roots, sandbox,
                                                                 reachable):
    root = roots("hostile")
    honest = run_autograder(container(autograder, roots("honest"),
                                      lambda folder: with_mistake(folder, WRONG)), sandbox)
    assert 0 < honest["score"] < sum(test["max_score"] for test in honest["tests"])
    results = run_autograder(container(autograder, root, lambda folder: with_mistake(
        folder, WRONG + HOSTILE.format(root=str(root), rounds=600))), sandbox)
    time.sleep(1.0)  # the process it left running had time to write, were it still running
    for graded in (results, json.loads((root / "results" / "results.json").read_text())):
        assert "LEAKED" not in json.dumps(graded) and HIDDEN_MARK not in json.dumps(graded)
        assert [(t["name"], t["score"], t["status"]) for t in graded["tests"]] == \
            [(t["name"], t["score"], t["status"]) for t in honest["tests"]]
        assert graded["score"] == honest["score"]
    assert sorted(path.name for path in (root / "results").iterdir()) == ["results.json"]
    assert results["output"].startswith(f"sandbox: {sandbox}")
    assert not processes_of(BOX_UID, running_only=True)
