"""What a graded class leaves behind: per submission Gradescope's ``results.json`` and a JUnit
``junit.xml``; for the class ``grades.csv`` (a row per submission and lab) and ``report.md``
(the most common failures, who hung, who was flagged). Hidden checks are told apart in each:
Gradescope shows them after the due date, JUnit puts them in a class of their own, the sheet
and the report count them apart. Every text a submission shaped (its folder's name, its
failures) is made safe for the file it goes to (:mod:`reference_impl.course.grade.safe_text`):
a name or message of any bytes is written, and nothing in it is run or ends a cell early."""
from __future__ import annotations

import collections
import csv
import json
import os
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from reference_impl.course.grade.results import Graded
from reference_impl.course.grade.safe_text import (for_csv_cell, for_markdown_cell,
                                                   for_markdown_code, for_text, for_xml)

# The first eight are the totals (public and hidden together); then the two tiers apart.
SHEET_COLUMNS = ["submission", "lab", "passed", "total", "score", "max_score", "flags", "notes",
                 "public_score", "public_max", "hidden_score", "hidden_max", "hidden_passed",
                 "hidden_total"]
# Gradescope's per-test visibility: a hidden check's name, score and output are shown to the
# student once the assignment's due date (its late due date, if any) has passed.
VISIBLE, AFTER_DUE_DATE = "visible", "after_due_date"


def gradescope(graded: Graded) -> dict:
    tests = [{"name": for_text(test.name), "score": round(test.score, 4),
              "max_score": round(test.max_score, 4),
              "status": "passed" if test.passed else "failed",
              "output": "" if test.passed else for_text(test.message or "skipped"),
              "visibility": AFTER_DUE_DATE if test.hidden else VISIBLE}
             for test in graded.tests]
    for flag in graded.flags:
        tests.append({"name": "flagged: uses the reference implementation", "score": 0,
                      "max_score": 0, "status": "failed", "output": for_text(flag),
                      "visibility": VISIBLE})
    return {"score": round(sum(test.score for test in graded.tests), 4),
            "execution_time": round(graded.seconds, 1),
            "output": for_text("\n".join(graded.notes
                                         + [f"flagged: {flag}" for flag in graded.flags]
                                         + ([graded.error] if graded.error else []))),
            "tests": tests}


def junit(graded: Graded) -> ElementTree.ElementTree:
    failures = sum(not test.passed and not test.skipped for test in graded.tests)
    suite = ElementTree.Element("testsuite", name=for_xml(graded.submission),
                                tests=str(len(graded.tests)),
                                failures=str(failures),
                                skipped=str(sum(t.skipped for t in graded.tests)),
                                time=f"{graded.seconds:.1f}")
    for test in graded.tests:
        tier = ".hidden" if test.hidden else ""
        case = ElementTree.SubElement(suite, "testcase",
                                      classname=for_xml(f"{graded.submission}.{test.lab}{tier}"),
                                      name=for_xml(test.name), time=f"{test.duration:.2f}")
        if test.skipped:
            ElementTree.SubElement(case, "skipped", message=for_xml(test.message[:200]))
        elif not test.passed:
            first = (test.message.splitlines() or [""])[0][:200]
            failure = ElementTree.SubElement(case, "failure", message=for_xml(first))
            failure.text = for_xml(test.message)
    if graded.notes or graded.flags:
        ElementTree.SubElement(suite, "system-out").text = for_xml("\n".join(
            graded.notes + [str(flag) for flag in graded.flags]))
    return ElementTree.ElementTree(suite)


def sheet_rows(graded: Graded, labs: list[str]) -> list[dict]:
    """The sheet's rows of one submission, a row per lab; each text a cell no spreadsheet
    runs."""
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
    return [{column: for_csv_cell(value) if isinstance(value, str) else value
             for column, value in row.items()} for row in rows]


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
        lines.append(f"| {count} | {for_markdown_code(name)}{tier} | {for_markdown_cell(first)} |")
    hung = [g.submission for g in results if any(note.startswith("hung") for note in g.notes)]
    flagged = [g.submission for g in results if g.flags]
    errored = [g.submission for g in results if g.error]
    lines += ["", f"Hung: {_names(hung)}.", f"Flagged: {_names(flagged)}.",
              f"Grading raised: {_names(errored)}."]
    return "\n".join(lines) + "\n"


def _names(submissions: list[str]) -> str:
    return ", ".join(for_markdown_cell(name) for name in submissions) or "none"


def write_submission(graded: Graded, out: Path) -> None:
    folder = out / _folder_name(graded.submission)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(gradescope(graded), indent=2) + "\n",
                                         encoding="utf-8")
    junit(graded).write(folder / "junit.xml", encoding="utf-8", xml_declaration=True)


def _folder_name(submission: str) -> str:
    """The submission's own folder name (any bytes, as ``os.fsdecode`` gave them), or where
    no file system name can hold it, its safe text."""
    try:
        os.fsencode(submission)
    except UnicodeError:
        return for_text(submission)
    return submission


def write_class(results: list[Graded], labs: list[str], out: Path) -> None:
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=SHEET_COLUMNS)
        writer.writeheader()
        for graded in results:
            writer.writerows(sheet_rows(graded, labs))
    (out / "report.md").write_text(common_failures(results), encoding="utf-8")
