"""A graded run's results, read from the log the kit's pytest plugin writes as the run goes
(``--grading-log``: one JSON record per collected test, test phase, launch, hang and finding),
so that a run killed half-way still has results for what it did."""
from __future__ import annotations

import contextlib
import json
import signal
from dataclasses import dataclass
from pathlib import Path

from reference_impl.course.grade.safe_text import head_and_tail

MESSAGE_LIMIT = 4_000  # characters of a failing test's output kept


@dataclass
class TestResult:
    name: str
    lab: str
    passed: bool
    skipped: bool
    message: str
    duration: float
    score: float = 0.0
    max_score: float = 0.0
    hidden: bool = False  # a hidden check (tests/labs/hidden/): shown after the due date


@dataclass(frozen=True)
class Flag:
    """A submission's file that imports the reference implementation of what it must write."""
    labs: tuple[str, ...]
    text: str

    def __str__(self) -> str:
        return f"{', '.join(self.labs)}: {self.text}"


@dataclass
class Graded:
    """One submission, graded (or, with ``error``, a grading that raised)."""
    submission: str
    tests: list[TestResult]
    flags: list[Flag]
    notes: list[str]
    seconds: float
    error: str = ""


@dataclass
class RunEnd:
    """How a graded run's process ended."""
    returncode: int
    killed_for_time: bool
    budget: float
    kill_grace: float
    tail: str  # the end of its own output


@dataclass
class _Outcome:
    lab: str
    failed: bool = False
    skipped: bool = False
    message: str = ""
    duration: float = 0.0


def read_log(log: Path) -> list[dict]:
    """The log's records; a line cut short by a killed run is left out."""
    if not log.exists():
        return []
    records = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def the_mistake(message: str) -> str:
    """The lines of a pytest failure that say what is wrong (its ``E`` lines), their first and
    last parts when they are long."""
    lines = [line[4:] if line.startswith("E   ") else line[1:].strip()
             for line in message.splitlines() if line.startswith("E ")]
    text = "\n".join(lines) if lines else message.strip()
    return head_and_tail(text, MESSAGE_LIMIT)


def _outcomes(records: list[dict]) -> dict[str, _Outcome]:
    outcomes: dict[str, _Outcome] = {}
    for record in records:
        if record.get("event") != "report":
            continue
        outcome = outcomes.setdefault(record["nodeid"], _Outcome(record["lab"]))
        outcome.duration += record.get("duration", 0.0)
        if record["outcome"] == "failed":
            outcome.failed = True
            outcome.message = outcome.message or the_mistake(record.get("message", ""))
        elif record["outcome"] == "skipped":
            outcome.skipped = True
    return outcomes


def _named(nodeid: str, hidden: dict[str, str]) -> str:
    """A test as a note names it: a hidden check by its lab only, since the notes are shown
    to the student at once."""
    return f"a hidden check of {hidden[nodeid]}" if nodeid in hidden else nodeid


def _notes(records: list[dict], end: RunEnd, hidden: dict[str, str]) -> list[str]:
    notes = []
    # A clean end is pytest's own exit (0: all passed, 1: some failed) with its last record.
    finished = end.returncode in (0, 1) and any(r.get("event") == "finished" for r in records)
    started = [r["nodeid"] for r in records if r.get("event") == "start"]
    if end.killed_for_time:
        notes.append(f"the graded run went past its budget of {end.budget:g} s (+ "
                     f"{end.kill_grace:g} s) and was killed")
    elif not finished:
        how = (f"killed by signal {signal.Signals(-end.returncode).name}" if end.returncode < 0
               else f"exited with code {end.returncode}")
        where = f" while running {_named(started[-1], hidden)}" if started else ""
        notes.append(f"the graded run ended before it finished ({how}{where}): the "
                     "submission's code ended the grader's own process")
    hangs = [r["nodeid"] for r in records if r.get("event") == "hang"]
    if hangs:
        notes.append(f"hung: a launch did not finish within its time limit in "
                     f"{_named(hangs[0], hidden)} (a deadlock or an endless loop)")
    return notes


def results_of(name: str, labs: list[str], records: list[dict], end: RunEnd,
               seconds: float) -> Graded:
    """A submission's results from its graded run's log records."""
    collected = next((r["tests"] for r in records if r.get("event") == "collected"), None)
    flags = [Flag(tuple(r["labs"]), r["text"]) for r in records
             if r.get("event") == "flag" and set(r["labs"]) & set(labs)]
    outcomes = _outcomes(records)
    hidden = {test["nodeid"]: test["lab"] for test in collected or [] if test.get("hidden")}
    notes = _notes(records, end, hidden)
    tests = []
    if collected is None:
        notes.append("the graded run did not get as far as collecting the tests; its output:\n"
                     + head_and_tail(end.tail, MESSAGE_LIMIT))
    for test in collected or []:
        outcome = outcomes.get(test["nodeid"])
        if outcome is None:
            outcome = _Outcome(test["lab"], failed=True, message="not run: " + (
                notes[0] if notes else "the graded run ended before it"))
        tests.append(TestResult(test.get("name") or test["nodeid"].split("/")[-1], outcome.lab,
                                not outcome.failed and not outcome.skipped,
                                outcome.skipped and not outcome.failed, outcome.message,
                                outcome.duration, hidden=test["nodeid"] in hidden))
    for record in records:  # a test file that could not be imported
        if record.get("event") == "report" and record.get("phase") == "collect":
            tests.append(TestResult(record["nodeid"].split("/")[-1], record["lab"], False, False,
                                    the_mistake(record.get("message", "")), 0.0,
                                    hidden=bool(record.get("hidden"))))
    return Graded(name, tests, flags, notes, seconds)


def errored(name: str, error: BaseException, trace: str, seconds: float) -> Graded:
    """A submission whose grading raised: a row of its own, saying so, rather than none."""
    return Graded(name, [], [], [f"the grading raised {type(error).__name__}: {error}"], seconds,
                  error=trace)
