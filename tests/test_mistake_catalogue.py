"""Every mistake in the catalogue (tests/mistake_catalogue.py) is caught by the graded tests it
names, with the message that names it.

Each entry is handed in as a submission: a copy of the solutions (every student file, as
``tests/test_grading.py``'s ``copy_of`` makes it) with the entry's mutation applied. Its
selected graded tests run as a grader runs them (``pytest --impl PATH -m LAB -k SELECT``, two
submissions at a time on the machine's cores); they must fail, and their output must contain
the entry's message. The unmutated copy, run once over the union of every entry's selection,
must pass.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mistake_catalogue import CATALOGUE
from test_grading import copy_of

REPO = Path(__file__).resolve().parents[1]
NO_TESTS_COLLECTED = 5  # pytest's exit code


def graded(submission: Path, labs: list[str], select: str) -> subprocess.CompletedProcess:
    """The labs' graded tests selected by ``select``, on ``submission``, as a grader runs them
    (only the labs' test files are collected: collecting the whole suite costs seconds)."""
    files = sorted(str(path.relative_to(REPO)) for lab in labs
                   for path in (REPO / "tests").glob(f"test_{lab}_*.py"))
    command = [sys.executable, "-m", "pytest", *files, "--impl", str(submission),
               "-m", " or ".join(labs),
               "-k", select, "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=",
               "-x"]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def mutated(mistake, destination: Path) -> Path:
    submission = copy_of("solutions", destination)
    path = submission / f"{mistake.module}.py"
    text = path.read_text()
    found = text.count(mistake.find)
    assert found == 1, (f"catalogue entry {mistake.name!r}: its find text occurs {found} times in "
                        f"{mistake.module}.py (must be once): {mistake.find!r}")
    path.write_text(text.replace(mistake.find, mistake.replace))
    return submission


def test_the_catalogue_has_entries_with_distinct_names():
    names = [mistake.name for mistake in CATALOGUE]
    assert names and len(set(names)) == len(names), f"empty, or names repeated: {names}"


@pytest.mark.skipif(not CATALOGUE, reason="the catalogue is empty")
def test_every_mistake_is_caught_with_its_message(tmp_path):
    submissions = [mutated(mistake, tmp_path / f"mistake{index}")
                   for index, mistake in enumerate(CATALOGUE)]
    correct = copy_of("solutions", tmp_path / "correct")
    labs = sorted({mistake.lab for mistake in CATALOGUE})
    union = " or ".join(sorted({f"({mistake.select})" for mistake in CATALOGUE}))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda job: graded(*job),
                             [(submission, [mistake.lab], mistake.select)
                              for submission, mistake in zip(submissions, CATALOGUE)]
                             + [(correct, labs, union)]))
    *mutated_runs, correct_run = runs
    problems = []
    for mistake, run in zip(CATALOGUE, mutated_runs):
        output = run.stdout + run.stderr
        if run.returncode == NO_TESTS_COLLECTED:
            problems.append(f"{mistake.name!r}: -m {mistake.lab} -k {mistake.select!r} selects "
                            "no graded test")
        elif run.returncode == 0:
            problems.append(f"{mistake.name!r} passes -m {mistake.lab} -k {mistake.select!r}: "
                            "no graded test catches it")
        elif mistake.message not in output:
            problems.append(f"{mistake.name!r} is caught, but its output lacks the message "
                            f"{mistake.message!r}:\n{output[-2500:]}")
    assert not problems, "\n\n".join(problems)
    assert correct_run.returncode == 0, (
        f"the unmutated solutions fail the catalogue's selection:\n"
        f"{(correct_run.stdout + correct_run.stderr)[-3000:]}")
