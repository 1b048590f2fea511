"""One lab of a solved submission graded by the batch grader's own command, its tree measured
(:mod:`.tree`), and the seconds of its parts as seen from outside: the grader's first line
(its start), the grading log's records (pytest's collection, its first test, each launch and
its world size) as the run writes them, and the tests' own times from the JUnit file."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from reference_impl.benchmarks.grading_cost.tree import TreeRun, run_measured

SUBMISSION = "solved"
LOG = "grading-*/grade-*/log.jsonl"  # the grading log, in the grader's temporary folder


@dataclass
class LabCost:
    """One lab graded on the solved submission: what its tree took, and its parts."""
    lab: str
    tests: int
    passed: int
    wall: float
    cpu: float
    peak_bytes: int
    memory_method: str
    largest_process_bytes: int
    grader_start: float  # to the grader's first line: interpreter, torch, its sandbox probe
    pytest_start: float  # the submission's run begun -> its tests collected
    pytest_probe: float  # tests collected -> the first test started: pytest's rank server
    tests_seconds: float  # the tests' own time (set-up, call, tear-down), launches included
    submission_seconds: float  # the submission's graded run, as the grader reports it
    exit_seconds: float  # the grader's last line -> the tree gone: its exit, its rank server's
    launches: dict[int, int]  # world size -> launches of that size
    load_before: float  # the 1-minute load average
    load_after: float


def solved_class(folder: Path) -> Path:
    """A folder of submissions holding one: the reference's student files."""
    from reference_impl.course import make_labs
    submission = folder / "submissions" / SUBMISSION
    submission.mkdir(parents=True)
    for module in make_labs.modules_with_exercises():
        shutil.copy(module, submission / module.name)
    return submission.parent


def grader_command(lab: str, submissions: Path, out: Path, select: str | None,
                   sandbox: str | None) -> list[str]:
    """The batch grader's command for one lab, one submission at a time."""
    return [sys.executable, "-m", "reference_impl.course.grade", str(submissions), "--labs", lab,
            "--out", str(out), "--jobs", "1", *(["-k", select] if select else []),
            *(["--sandbox", sandbox] if sandbox else [])]


def grade_lab(lab: str, submissions: Path, out: Path, select: str | None = None,
              sandbox: str | None = None, memory: str = "auto") -> LabCost:
    """Grade ``lab`` (``"lab7"``) of the one submission in ``submissions`` into ``out``; the
    grader's temporary folders (its grading log among them) in a short-named one of its own:
    the sockets of its launches live there, and a socket's path is limited to 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="gc") as temporary:
        load_before = os.getloadavg()[0]
        run = run_measured(grader_command(lab, submissions, out, select, sandbox),
                           {**os.environ, "TMPDIR": temporary}, (Path(temporary), LOG), memory)
        load_after = os.getloadavg()[0]
    output = "\n".join(text for _, text in run.lines)
    results = out / SUBMISSION / "results.json"
    tests = json.loads(results.read_text())["tests"] if results.exists() else []
    if run.returncode != 0 or not tests or first(run.log, "start") is None:
        raise RuntimeError(f"grading {lab} (exit code {run.returncode}) ran no test:\n"
                           f"{output[-4000:]}")
    cases = ElementTree.parse(out / SUBMISSION / "junit.xml").getroot().iter("testcase")
    return LabCost(
        lab=lab, tests=len(tests), passed=sum(test["status"] == "passed" for test in tests),
        wall=run.wall, cpu=run.cpu, peak_bytes=run.peak_bytes, memory_method=run.memory_method,
        largest_process_bytes=run.largest_process_bytes, grader_start=run.lines[0][0],
        pytest_start=first(run.log, "collected") - line_time(run, r"\] \S+: grading$"),
        pytest_probe=first(run.log, "start") - first(run.log, "collected"),
        tests_seconds=sum(float(case.get("time")) for case in cases),
        submission_seconds=float(re.search(r"\] \S+: .* in ([\d.]+) s", output).group(1)),
        exit_seconds=run.wall - run.lines[-1][0],
        launches=dict(Counter(record["world_size"] for _, record in run.log
                              if record.get("event") == "launch")),
        load_before=load_before, load_after=load_after)


def first(log: list[tuple[float, dict]], event: str) -> float | None:
    """When the log's first ``event`` record was seen."""
    return next((second for second, record in log if record.get("event") == event), None)


def line_time(run: TreeRun, pattern: str) -> float:
    """When the run's first output line matching ``pattern`` was seen."""
    return next(second for second, text in run.lines if re.search(pattern, text))
