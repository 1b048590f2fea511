"""What a graded class leaves behind: per submission Gradescope's ``results.json`` and a JUnit
``junit.xml``; for the class ``grades.csv`` (a row per submission and lab) and ``report.md``
(the most common failures, who hung, who was flagged). Hidden checks are told apart in each:
Gradescope shows them after the due date, JUnit puts them in a class of their own, the sheet
and the report count them apart."""
from __future__ import annotations

import collections
import csv
import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from reference_impl.course.grade.results import Graded

# The first eight are the totals (public and hidden together); then the two tiers apart.
SHEET_COLUMNS = ["submission", "lab", "passed", "total", "score", "max_score", "flags", "notes",
                 "public_score", "public_max", "hidden_score", "hidden_max", "hidden_passed",
                 "hidden_total"]
# Gradescope's per-test visibility: a hidden check's name, score and output are shown to the
# student once the assignment's due date (its late due date, if any) has passed.
VISIBLE, AFTER_DUE_DATE = "visible", "after_due_date"


def gradescope(graded: Graded) -> dict:
    tests = [{"name": test.name, "score": round(test.score, 4),
              "max_score": round(test.max_score, 4),
              "status": "passed" if test.passed else "failed",
              "output": "" if test.passed else (test.message or "skipped"),
              "visibility": AFTER_DUE_DATE if test.hidden else VISIBLE}
             for test in graded.tests]
    for flag in graded.flags:
        tests.append({"name": "flagged: uses the reference implementation", "score": 0,
                      "max_score": 0, "status": "failed", "output": str(flag),
                      "visibility": VISIBLE})
    return {"score": round(sum(test.score for test in graded.tests), 4),
            "execution_time": round(graded.seconds, 1),
            "output": "\n".join(graded.notes + [f"flagged: {flag}" for flag in graded.flags]
                                + ([graded.error] if graded.error else [])),
            "tests": tests}


def junit(graded: Graded) -> ElementTree.ElementTree:
    failures = sum(not test.passed and not test.skipped for test in graded.tests)
    suite = ElementTree.Element("testsuite", name=graded.submission, tests=str(len(graded.tests)),
                                failures=str(failures),
                                skipped=str(sum(t.skipped for t in graded.tests)),
                                time=f"{graded.seconds:.1f}")
    for test in graded.tests:
        tier = ".hidden" if test.hidden else ""
        case = ElementTree.SubElement(suite, "testcase",
                                      classname=f"{graded.submission}.{test.lab}{tier}",
                                      name=test.name, time=f"{test.duration:.2f}")
        if test.skipped:
            ElementTree.SubElement(case, "skipped", message=test.message[:200])
        elif not test.passed:
            failure = ElementTree.SubElement(case, "failure",
                                             message=(test.message.splitlines() or [""])[0][:200])
            failure.text = test.message
    if graded.notes or graded.flags:
        ElementTree.SubElement(suite, "system-out").text = "\n".join(
            graded.notes + [str(flag) for flag in graded.flags])
    return ElementTree.ElementTree(suite)


def sheet_rows(graded: Graded, labs: list[str]) -> list[dict]:
    rows = []
    for lab in labs:
        tests = [test for test in graded.tests if test.lab == lab]
        public = [test for test in tests if not test.hidden]
        hidden = [test for test in tests if test.hidden]
        flags = [str(flag) for flag in graded.flags if lab in flag.labs]
        rows.append({"submission": graded.submission, "lab": lab,
                     "passed": sum(test.passed for test in tests), "total": len(tests),
                     "score": _total(tests, "score"), "max_score": _total(tests, "max_score"),
                     "flags": " | ".join(flags), "notes": " | ".join(
                         note.splitlines()[0] for note in graded.notes),
                     "public_score": _total(public, "score"),
                     "public_max": _total(public, "max_score"),
                     "hidden_score": _total(hidden, "score"),
                     "hidden_max": _total(hidden, "max_score"),
                     "hidden_passed": sum(test.passed for test in hidden),
                     "hidden_total": len(hidden)})
    return rows


def _total(tests, what: str) -> float:
    return round(sum(getattr(test, what) for test in tests), 2)


def common_failures(results: list[Graded], most: int = 10) -> str:
    counter = collections.Counter()
    for graded in results:
        for test in graded.tests:
            if not test.passed and not test.skipped:
                first = (test.message.splitlines() or ["(no message)"])[0][:160]
                counter[re.sub(r"\[.*\]$", "", test.name), test.hidden, first] += 1
    graded_line = f"{len(results)} submission(s) graded."
    if any(test.hidden for graded in results for test in graded.tests):
        graded_line += (" A test marked (hidden) is a hidden check (tests/labs/hidden/): not in "
                        "the students' handout, its result shown to them after the due date.")
    lines = ["# Most common failures", "", graded_line, "",
             "| submissions | test | first line of the failure |", "|---|---|---|"]
    for (name, hidden, first), count in counter.most_common(most):
        tier = " (hidden)" if hidden else ""
        lines.append(f"| {count} | `{name}`{tier} | {first.replace('|', '/')} |")
    hung = [g.submission for g in results if any(note.startswith("hung") for note in g.notes)]
    flagged = [g.submission for g in results if g.flags]
    errored = [g.submission for g in results if g.error]
    lines += ["", f"Hung: {', '.join(hung) or 'none'}.", f"Flagged: {', '.join(flagged) or 'none'}.",
              f"Grading raised: {', '.join(errored) or 'none'}."]
    return "\n".join(lines) + "\n"


def write_submission(graded: Graded, out: Path) -> None:
    folder = out / graded.submission
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(gradescope(graded), indent=2) + "\n")
    junit(graded).write(folder / "junit.xml", encoding="unicode")


def write_class(results: list[Graded], labs: list[str], out: Path) -> None:
    with open(out / "grades.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=SHEET_COLUMNS)
        writer.writeheader()
        for graded in results:
            writer.writerows(sheet_rows(graded, labs))
    (out / "report.md").write_text(common_failures(results))
