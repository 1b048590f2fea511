"""The course pipeline itself: student files are generated, never hand-edited; every graded
test fails on the untouched stubs with the not-implemented hint, and passes on a submission
that holds the solutions."""
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import nbformat
import pytest

from reference_impl.course import make_labs

REPO = Path(__file__).resolve().parents[1]
# Every lab marker registered in pyproject.toml, e.g. "lab0 or lab1 or lab2".
LABS = re.findall(r'^\s*"(lab\d+):', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
GRADED = " or ".join(LABS)


def test_student_files_are_what_the_generator_writes():
    stale = [str(path.relative_to(REPO)) for path in make_labs.out_of_date()]
    assert not stale, (f"student files differ from the solutions they are generated from: "
                       f"{stale}; run `python -m reference_impl.course.make_labs`")


def test_every_module_with_exercises_has_a_student_file():
    assert {path.name for path in make_labs.modules_with_exercises()} <= {
        path.name for path in (REPO / "labs").glob("*.py")}


def run_graded_tests(impl: str, tmp_path: Path):
    report = tmp_path / "report.xml"
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-m", GRADED, "--impl", impl,
         "-p", "no:cacheprovider", f"--junitxml={report}", "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    cases = ElementTree.parse(report).getroot().iter("testcase")
    return process, {f"{case.get('classname')}.{case.get('name')}": case for case in cases}


def test_graded_tests_fail_on_the_stubs_with_the_hint(tmp_path):
    process, cases = run_graded_tests("labs", tmp_path)
    assert cases, process.stdout + process.stderr
    for name, case in cases.items():
        problems = case.findall("failure") + case.findall("error")
        assert problems, f"{name} passed on the unmodified stubs: it cannot catch a missing solution"
        text = " ".join((p.get("message") or "") + (p.text or "") for p in problems)
        assert "NotImplementedError" in text, f"{name} failed on the stubs, but not with the hint"
    for lab in LABS:
        assert f"{lab}: 0/" in process.stdout, f"no summary line for {lab}:\n{process.stdout[-2000:]}"


def test_graded_tests_pass_on_a_submission_of_the_solutions(tmp_path):
    submission = tmp_path / "submission"
    submission.mkdir()
    for module in make_labs.modules_with_exercises():
        shutil.copy(module, submission / module.name)
    process, cases = run_graded_tests(str(submission), tmp_path)
    assert process.returncode == 0, process.stdout[-3000:]
    summary = [line for line in process.stdout.splitlines() if line.startswith("lab")]
    assert [line.split(":")[0] for line in summary] == LABS, summary
    assert all(line.split()[1].split("/")[0] == line.split()[1].split("/")[1]
               for line in summary), summary


def test_a_missing_file_in_a_submission_is_named(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_lab0_collectives.py", "--impl",
         str(tmp_path), "-p", "no:cacheprovider", "-q", "-x"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "alpha_beta.py is missing" in process.stdout or "collectives.py is missing" in \
        process.stdout, process.stdout[-2000:]


# ------------------------------------------------------------ the generator's rules

def test_module_regions_become_stubs_with_their_hint(tmp_path):
    module = tmp_path / "example.py"
    module.write_text("def f(x):\n    y = 1\n    # BEGIN SOLUTION lab9: add one to x\n"
                      "    return x + y\n    # END SOLUTION\n")
    student = make_labs.student_module(module)
    assert "return x + y" not in student
    assert "    raise NotImplementedError('lab9: add one to x')\n" in student
    assert "    y = 1\n" in student


@pytest.mark.parametrize("source, message", [
    ("# BEGIN SOLUTION lab1: a\n# BEGIN SOLUTION lab1: b\n# END SOLUTION\n", "nested"),
    ("# BEGIN SOLUTION lab1: a\nx = 1\n", "without END SOLUTION"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "malformed solution marker"),
])
def test_malformed_markers_are_refused(tmp_path, source, message):
    module = tmp_path / "example.py"
    module.write_text(source)
    with pytest.raises(ValueError, match=message):
        make_labs.student_module(module)


def test_notebook_solutions_answers_outputs_and_imports_are_replaced(tmp_path):
    notebook = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell(
        "from reference_impl.groups import build_rank_layout\n"
        "from reference_impl.launcher import launch\n"
        "### BEGIN SOLUTION: predict the sum\npredicted = 6\n### END SOLUTION\nprint(predicted)")
    code.outputs = [nbformat.v4.new_output("stream", text="6\n")]
    code.execution_count = 3
    answer = nbformat.v4.new_markdown_cell("Why?\n<!-- BEGIN SOLUTION -->\nBecause.\n"
                                           "<!-- END SOLUTION -->")
    notebook.cells = [code, answer]
    path = tmp_path / "lab9_example.ipynb"
    nbformat.write(notebook, path)
    student = nbformat.reads(make_labs.student_notebook(path, ["groups"]), as_version=4)
    assert student.cells[0].source == (
        "from groups import build_rank_layout\nfrom reference_impl.launcher import launch\n"
        "# YOUR CODE HERE\nraise NotImplementedError('predict the sum')\nprint(predicted)")
    assert student.cells[0].outputs == [] and student.cells[0].execution_count is None
    assert student.cells[1].source == "Why?\n*Your answer here.*"
