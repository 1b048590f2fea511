"""Submissions to grade and what a graded run's test cases must show, read from its JUnit
report: every case failing with the not-implemented hint (on the stubs), or every case passing
(on the solutions)."""
from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from reference_impl.course import make_labs
from support import REPO


def copy_of(files: str, destination: Path) -> Path:
    """A submission outside the repository: every student file, from ``files`` = "stubs"
    (``labs/``) or "solutions" (each file as a student hands it in with every exercise done:
    the reference's solutions in place, importing the student's files of the same lab)."""
    destination.mkdir(parents=True)
    for module in make_labs.modules_with_exercises():
        target = destination / module.name
        if files == "stubs":
            shutil.copy(REPO / "labs" / module.name, target)
        else:
            target.write_text(make_labs.student_module(module, solved=True))
    return destination


def cases_of(report: Path) -> dict:
    """The report's test cases by name."""
    cases = ElementTree.parse(report).getroot().iter("testcase")
    return {f"{case.get('classname')}.{case.get('name')}": case for case in cases}


def failure_text(case) -> str | None:
    """What a failed or errored case says; None if it did neither."""
    problems = case.findall("failure") + case.findall("error")
    if not problems:
        return None
    return " ".join((p.get("message") or "") + (p.text or "") for p in problems)


def _skipped_for_gpus(case) -> bool:
    """Skipped under --backend nccl on a machine with too few GPUs, saying so."""
    skipped = case.find("skipped")
    return skipped is not None and "GPUs" in (skipped.get("message") or "")


def assert_every_case_fails_with_the_hint(process, cases) -> None:
    assert cases, process.stdout + process.stderr
    for name, case in cases.items():
        if _skipped_for_gpus(case):
            continue
        text = failure_text(case)
        assert text is not None, (f"{name} passed on the unmodified stubs: it cannot catch a "
                                  "missing solution")
        assert "NotImplementedError" in text, f"{name} failed on the stubs, but not with the hint"


def assert_every_case_passes(process, cases, labs) -> None:
    assert cases, process.stdout + process.stderr
    for name, case in cases.items():
        skipped = case.find("skipped")
        if skipped is not None:
            assert _skipped_for_gpus(case), f"{name} skipped: {skipped.get('message')}"
            continue
        assert failure_text(case) is None, f"{name} failed:\n" + process.stdout[-3000:]
    summary = [line for line in process.stdout.splitlines() if re.match(r"lab\d+: ", line)]
    assert [line.split(":")[0] for line in summary] == labs, process.stdout[-3000:]
