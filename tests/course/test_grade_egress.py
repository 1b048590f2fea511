"""What leaves the batch grader is safe for the file it goes to, whatever a submission put in
its folder's name or its failures: ``results.json`` is UTF-8 JSON, ``junit.xml`` parses,
``grades.csv`` has every student's rows and no cell a spreadsheet runs, ``report.md`` keeps its
table; a long failure keeps its first and last parts. A student file too large to parse in
pytest's own process is not parsed, and is flagged for a look by hand."""
import csv
import json
import os
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from reference_impl.course import graded_run
from reference_impl.course.grade import reports
from reference_impl.course.grade.results import MESSAGE_LIMIT, Flag, Graded, the_mistake
from reference_impl.course.grade.results import TestResult as Result  # not a test class
from reference_impl.course.grade.safe_text import (for_csv_cell, for_markdown_cell, for_text,
                                                   for_xml, head_and_tail)

LABS = ["lab0", "lab1"]
NOT_UTF8 = os.fsdecode(b"stu\xffdent")  # a folder name that is not UTF-8, as listed
CONTROLS = "".join(map(chr, range(32)))
HOSTILE = "bad \ud800 lone \udfff surrogates, controls " + CONTROLS + " \x7f\x85 end"
FORMULAS = ['=HYPERLINK("http://example.com","click")', "@SUM(A1:A9)", "+1+2", "-3+4",
            " =1+1", "\tpadded"]
LONG = "HEAD-OF-THE-FAILURE " + "x" * 100_000 + " TAIL-OF-THE-FAILURE"


def failing(name: str, message: str, lab: str = "lab0", hidden: bool = False) -> Result:
    return Result(name, lab, False, False, message, 1.0, 0.0, 1.0, hidden)


def graded(submission: str, *tests: Result, notes=(), flags=()) -> Graded:
    return Graded(submission, list(tests), list(flags), list(notes), 3.0)


def the_class() -> list[Graded]:
    """Honest students around hostile ones: the last student's rows must be written too."""
    return [
        graded("aaron", Result("test_lab0.py::test_ring", "lab0", True, False, "", 1.0, 1, 1)),
        graded(NOT_UTF8, failing("test_lab0.py::test_ring", HOSTILE),
               failing(f"test_lab1.py::test_{NOT_UTF8}", NOT_UTF8, "lab1"),
               notes=[f"hung: {HOSTILE}"], flags=[Flag(("lab0",), HOSTILE)]),
        *(graded(name, failing("test_lab0.py::test_ring", name)) for name in FORMULAS),
        graded("pipes", failing("test_lab0.py::test_`odd`|name", "E  a|b `c` <b>[x](y)\nmore"),
               failing("test_lab0.py::test_long", the_mistake(LONG))),
        graded("zoe", Result("test_lab0.py::test_ring", "lab0", True, False, "", 1.0, 1, 1)),
    ]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("results")
    for each in the_class():
        reports.write_submission(each, out)
    reports.write_class(the_class(), LABS, out)
    return out


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def safe(text: str) -> bool:
    """No surrogate and no control character but tab and newline."""
    return not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]", text)


def test_results_json_is_utf8_json_with_safe_text_for_every_submission(written):
    for each in the_class():
        path = written / each.submission / "results.json"
        result = json.loads(path.read_bytes().decode("utf-8"))  # strict: any bad byte raises
        assert all(safe(text) for text in strings_in(result)), result
    result = json.loads((written / NOT_UTF8 / "results.json").read_text(encoding="utf-8"))
    assert "bad \\ud800 lone \\udfff surrogates" in result["tests"][0]["output"]
    assert "\\x00\\x01" in result["tests"][0]["output"] and "hung: bad" in result["output"]


def test_junit_parses_with_controls_and_surrogates_in_names_and_messages(written):
    for each in the_class():
        suite = ElementTree.parse(written / each.submission / "junit.xml").getroot()
        assert suite.get("name") == for_xml(each.submission)
        assert len(suite.findall("testcase")) == len(each.tests)
    suite = ElementTree.parse(written / NOT_UTF8 / "junit.xml").getroot()
    assert suite.get("name") == "stu\\xffdent"
    assert "\\x1b" in suite.find("testcase/failure").text


def test_the_sheet_has_every_student_s_rows_and_no_formula(written):
    with open(written / "grades.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["submission"] for row in rows] == [
        for_csv_cell(each.submission) for each in the_class() for _ in LABS]
    assert rows[-1]["submission"] == "zoe" and "stu\\xffdent" in rows[2]["submission"]
    for row in rows:
        for cell in row.values():
            assert not cell.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")), row
    assert {row["submission"] for row in rows} >= {"'" + FORMULAS[0], "'@SUM(A1:A9)", "'-3+4"}


def test_the_report_is_written_with_intact_table_rows(written):
    report = (written / "report.md").read_text(encoding="utf-8")
    rows = [line for line in report.splitlines() if line.startswith("|")]
    assert len(rows) > 2
    for row in rows:  # three cells: four pipes not escaped
        assert len(re.findall(r"(?<!\\)\|", row)) == 4, row
    assert "``test_lab0.py::test_`odd`\\|name``" in report
    assert "a\\|b \\`c\\` \\<b\\>\\[x\\](y)" in report
    assert "Hung: stu\\\\xffdent." in report and safe(report)  # the escape, escaped


def test_a_long_failure_keeps_its_head_and_its_tail():
    kept = the_mistake(LONG)
    assert kept.startswith("HEAD-OF-THE-FAILURE") and kept.endswith("TAIL-OF-THE-FAILURE")
    assert "characters cut ..." in kept and len(kept) < MESSAGE_LIMIT + 100
    assert head_and_tail("short", 10) == "short"


def test_each_sink_s_rule():
    assert for_text("stu\udcffdent \ud800 a\r\nb\x1b\tc") == "stu\\xffdent \\ud800 a\nb\\x1b\tc"
    assert for_xml("\ufffe\x00") == "\\ufffe\\x00"
    assert [for_csv_cell(text) for text in ("=1", " @x", "plain", "a=b")] == [
        "'=1", "' @x", "plain", "a=b"]
    assert for_markdown_cell("a|b\nc `d`") == "a\\|b c \\`d\\`"


# ------------------------------------------------------------ the source parsed in pytest


def test_a_student_file_over_the_size_bound_is_flagged_not_parsed(tmp_path, monkeypatch):
    def no_parse(*args):
        raise AssertionError("parsed in pytest's own process")

    (tmp_path / "collectives.py").write_text("x = 1\n" * (graded_run.SOURCE_LIMIT // 6 + 1))
    monkeypatch.setattr(graded_run, "reference_imports", no_parse)
    finding, = graded_run.imports_of_the_reference(tmp_path, "collectives")
    assert finding.startswith("collectives.py was not checked for imports of the reference")
    assert "more than the 262,144 the check reads" in finding


def test_a_file_the_parser_cannot_take_or_not_a_plain_file_is_flagged(tmp_path):
    (tmp_path / "collectives.py").write_text("1" + "+1" * 100_000)  # too deep for the parser
    os.mkfifo(tmp_path / "alpha_beta.py")  # reading it would wait for ever
    for name, why in (("collectives", "RecursionError"), ("alpha_beta", "not a plain file")):
        finding, = graded_run.imports_of_the_reference(tmp_path, name)
        assert "was not checked" in finding and why in finding, finding


def test_a_small_file_is_still_checked(tmp_path):
    (tmp_path / "collectives.py").write_text("from reference_impl.comm.collectives import *\n")
    finding, = graded_run.imports_of_the_reference(tmp_path, "collectives")
    assert "line 1 imports reference_impl.comm.collectives" in finding
    assert graded_run.imports_of_the_reference(tmp_path, "alpha_beta") == []
