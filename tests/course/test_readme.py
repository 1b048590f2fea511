"""The examples of the README and of ``docs/`` run as printed: every Python block, and every
command a user is told to run on one machine (the cluster commands, torchrun and sbatch, are
tested by tests/library/hybrid/test_train.py with CPU ranks and two local agents)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reference_impl.course.sandboxing import probe
from support import documents
from support import nested
from support import REPO

pytestmark = pytest.mark.slow

TEXT = documents.text()
# Commands the suite runs elsewhere, because they write into the repository itself.
RUN_ELSEWHERE = {
    "python -m reference_impl.course.make_labs": "tests/course/test_grading.py checks its output",
    "python -m reference_impl.course.build_slides": "tests/course/test_slides.py builds a deck",
    "python -m reference_impl.course.snapshots":
        "tests/course/test_snapshots.py checks what it writes",
    "python -m reference_impl.course.check_machine":
        "tests/course/test_check_machine.py runs it as printed and reads its report",
    "python -m reference_impl.course.grade.merge results":
        "tests/course/test_grade_parts.py merges a class graded in parts",
    "python -m reference_impl.course.handout course-handout":
        "tests/course/test_handout.py builds the handout with it, as printed, and reads it",
}


def class_of_stubs(folder: Path) -> None:
    """A ``submissions/`` folder holding one submission: the untouched student files."""
    submission = folder / "submissions" / "stubs"
    submission.mkdir(parents=True)
    for stub in (REPO / "labs").glob("*.py"):
        shutil.copy(stub, submission / stub.name)


# Commands that act on a folder the user has: what the test puts in its working directory.
PREPARED = {"python -m reference_impl.course.grade submissions --labs 6 --out results":
            class_of_stubs}


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", TEXT, re.MULTILINE | re.DOTALL)


def commands() -> list[str]:
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            if command.startswith("python -m reference_impl") and "[" not in command \
                    and command not in found:
                found.append(command)
    return found


def run(arguments, tmp_path, **options):
    environment = {**os.environ, "MPLBACKEND": "Agg",
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(arguments, cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=nested.LIMIT, **options)


def test_the_examples_are_found():
    assert len(blocks("python")) >= 5
    assert "python -m reference_impl.perf.planner --preset 70b --nodes 16 --gpus-per-node 8 " \
           "--explain" in commands()


@pytest.mark.parametrize("block", blocks("python"), ids=lambda block: block.splitlines()[1][:40])
def test_python_example_runs_as_printed(block, tmp_path):
    process = run([sys.executable, "-c", block], tmp_path)
    assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-4000:]


@pytest.mark.parametrize("command", commands())
def test_command_runs_as_printed(command, tmp_path):
    if command in RUN_ELSEWHERE:
        pytest.skip(RUN_ELSEWHERE[command])
    if command.startswith("python -m reference_impl.course.grade ") and probe() is not None:
        pytest.skip(f"no sandbox here ({probe()}): the batch grader refuses to grade without one")
    if command in PREPARED:
        PREPARED[command](tmp_path)
    process = run(command, tmp_path, shell=True)
    assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-4000:]
    assert process.stdout.strip(), f"{command} printed nothing: did it run at all?"
