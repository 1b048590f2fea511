"""Every mistake in the catalogue (tests/support/mistake_catalogue.py) is caught by the graded tests it
names, with the message that names it.

Each entry is handed in as a submission: a copy of the solutions (every student file, as
``support.graded_cases.copy_of`` makes it) with the entry's mutation applied. One graded
run per lab, as a grader runs it, takes all of that lab's submissions at once (``pytest --impl A
--impl B ...``: every graded test once per submission) and selects, for each submission, the
tests its entry names (``-k "(SELECT) and mistake07 or ..."``). Those tests must fail, with the
entry's message in their output: a failure for another reason does not count. That the
unmutated solutions pass every graded test is checked elsewhere (the reference in ``tests/labs``,
a copy of the solutions by ``tests/course/test_grading.py``, each lab's solved files in the
handout by ``tests/course/test_term.py``). ``CATALOGUE_LABS=lab8,lab9`` runs those labs' entries
only.
"""
import os
import re
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.graded_cases import cases_of, copy_of, failure_text
from support.mistake_catalogue import CATALOGUE
from support import GRADED_TESTS, REPO

pytestmark = pytest.mark.slow

# One lab's graded run over all its entries (two run at once on two cores): the longest, lab 8's,
# takes about 3 minutes on a busy 2-core machine.
RUN_LIMIT = 600  # seconds


def mutated(mistake, destination: Path) -> Path:
    submission = copy_of("solutions", destination)
    path = submission / f"{mistake.module}.py"
    text = path.read_text()
    found = text.count(mistake.find)
    assert found == 1, (f"catalogue entry {mistake.name!r}: its find text occurs {found} times in "
                        f"{mistake.module}.py (must be once): {mistake.find!r}")
    path.write_text(text.replace(mistake.find, mistake.replace))
    return submission


def submission_name(index: int) -> str:
    """The submission of entry ``index``: three digits, so that no name is part of another
    (``-k`` matches substrings: "mistake10" would select mistake100 too)."""
    return f"mistake{index:03d}"


def graded_run(lab: str, entries, folder: Path) -> dict[str, list]:
    """One run of ``lab``'s graded tests over its entries' submissions; {submission name:
    [(test name, failure text or None)]}."""
    submissions = {}
    for index, mistake in entries:
        submissions[submission_name(index)] = mutated(mistake, folder / submission_name(index))
    select = " or ".join(f"(({mistake.select}) and {submission_name(index)})"
                         for index, mistake in entries)
    files = sorted(str(path.relative_to(REPO)) for path in GRADED_TESTS.glob(f"test_{lab}_*.py"))
    report = folder / "report.xml"
    command = [sys.executable, "-m", "pytest", *files, "-m", lab, "-k", select, "-q",
               "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={report}"]
    for path in submissions.values():
        command += ["--impl", str(path)]
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=RUN_LIMIT,
                             env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert report.exists(), f"the graded run of {lab} did not run:\n{process.stdout[-3000:]}"
    outcomes = defaultdict(list)
    for case in cases_of(report).values():
        name = case.get("name")
        found = re.search(r"[\[-](mistake\d{3})[\]-]", name)
        submission = found.group(1) if found else ""
        outcomes[submission].append((name, failure_text(case)))
    return outcomes


def test_the_catalogue_has_entries_with_distinct_names():
    names = [mistake.name for mistake in CATALOGUE]
    assert names and len(set(names)) == len(names), f"empty, or names repeated: {names}"


@pytest.mark.skipif(not CATALOGUE, reason="the catalogue is empty")
@pytest.mark.timeout(3 * RUN_LIMIT)
def test_every_mistake_is_caught_with_its_message(tmp_path):
    by_lab = defaultdict(list)
    chosen = os.environ.get("CATALOGUE_LABS")
    for index, mistake in enumerate(CATALOGUE):
        if chosen is None or mistake.lab in chosen.split(","):
            by_lab[mistake.lab].append((index, mistake))
    labs = sorted(by_lab, key=lambda lab: -len(by_lab[lab]))  # the longest runs start first
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(labs, pool.map(lambda lab: graded_run(lab, by_lab[lab], tmp_path / lab),
                                       labs)))
    problems = []
    for lab, entries in by_lab.items():
        outcomes = runs[lab]
        for index, mistake in entries:
            cases = outcomes[submission_name(index)]
            caught = [text for _, text in cases if text is not None]
            if not cases:
                problems.append(f"{mistake.name!r}: -m {lab} -k {mistake.select!r} selects no "
                                "graded test")
            elif not caught:
                problems.append(f"{mistake.name!r} passes -m {lab} -k {mistake.select!r}: no "
                                "graded test catches it")
            elif not any(mistake.message in text for text in caught):
                problems.append(f"{mistake.name!r} is caught, but no failure says "
                                f"{mistake.message!r}:\n{caught[0][-2500:]}")
    assert not problems, "\n\n".join(problems)
