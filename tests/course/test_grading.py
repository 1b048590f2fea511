"""The course pipeline itself: student files are generated, never hand-edited; every graded
test fails on the untouched stubs with the not-implemented hint, and passes on a submission
that holds the solutions."""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from support import documents
from support import nested
from support.graded_cases import assert_every_case_passes, cases_of, copy_of, failure_text
from support.handout_runs import student_command
from reference_impl.course import make_labs, syllabus
from reference_impl.course.grade import reports, running
from reference_impl.course.grade.points import Points, score
from reference_impl.course.grade.results import Graded, RunEnd, read_log, results_of

from support import REPO
LABS = syllabus.markers()  # every lab marker the kit's plugin registers


def test_student_files_are_what_the_generator_writes():
    stale = [str(path.relative_to(REPO)) for path in make_labs.out_of_date()]
    assert not stale, (f"student files differ from the solutions they are generated from: "
                       f"{stale}; run `python -m reference_impl.course.make_labs`")


def test_every_module_with_exercises_has_a_student_file():
    assert {path.name for path in make_labs.modules_with_exercises()} <= {
        path.name for path in (REPO / "labs").glob("*.py")}


PLACEHOLDER = "path/to/student/labs"  # how the README names a submission


def graded_run(command: str, tmp_path: Path, cwd: Path = REPO):
    """Run a pytest command line exactly as a person types it (through the shell, from the
    repository root, with this environment's ``pytest`` first on PATH); return the process and
    its test cases by name, read from a JUnit report added through PYTEST_ADDOPTS."""
    report = tmp_path / "report.xml"
    environment = {**os.environ,
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   "PYTEST_ADDOPTS": f"-p no:cacheprovider --junitxml={report}"}
    process = subprocess.run(command, shell=True, cwd=cwd, env=environment,
                             capture_output=True, text=True, timeout=nested.LIMIT)
    assert report.exists(), f"`{command}` did not run:\n{process.stdout[-3000:]}{process.stderr}"
    return process, cases_of(report)


def documented_commands() -> list[str]:
    """Every grading command the README, the docs, the notebooks and the decks print, as
    printed."""
    texts = [documents.text()]
    for folder in ("labs", "solutions", "slides"):
        for path in sorted((REPO / folder).glob("*.ipynb")):
            texts += [cell.source for cell in nbformat.read(path, as_version=4).cells]
    found = set()
    for text in texts:
        found.update(match.strip() for match in
                     re.findall(r"(?:^|`)(pytest --impl [^`#\n]*)", text, re.MULTILINE))
    return sorted(found)


STUDENT_COMMANDS = [c for c in documented_commands() if PLACEHOLDER not in c]
GRADER_COMMANDS = [c for c in documented_commands() if PLACEHOLDER in c]
AT_ONCE = 3  # graded runs at a time: each is mostly waiting on its ranks' start-up


@pytest.fixture(scope="module")
def graded_runs(tmp_path_factory):
    """Every graded run of this module, started together (:data:`AT_ONCE` at a time) the first
    time a test asks for one: ``graded_runs[key]()`` waits for run ``key`` and returns
    ``graded_run``'s (process, cases), by grader command (on a copy of the solutions)."""
    runs = {}
    for command in GRADER_COMMANDS:
        where = tmp_path_factory.mktemp("grader")
        submission = copy_of("solutions", where / "elsewhere" / "labs")
        runs[command] = (command.replace(PLACEHOLDER, str(submission)), where)
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        futures = {key: pool.submit(graded_run, *run) for key, run in runs.items()}
        yield {key: future.result for key, future in futures.items()}


def labs_selected(command: str) -> list[str]:
    return [lab for lab in LABS if re.search(rf"\b{lab}\b", command)]


def test_the_documented_commands_are_found():
    commands = documented_commands()
    assert "pytest --impl labs -m lab0" in commands
    students = {lab for c in commands if PLACEHOLDER not in c for lab in labs_selected(c)}
    graded = {lab for c in commands for lab in labs_selected(c)}
    assert students == graded, f"no student command runs the stubs of {graded - students}"
    assert any(PLACEHOLDER in command and "nccl" in command for command in commands), commands
    assert {lab for command in commands for lab in labs_selected(command)} == set(LABS)


def test_every_student_command_is_one_the_term_runs():
    """A student's command (each lab's, as the notebooks print it) is run verbatim on the
    solved files, in the student handout, by ``tests/course/test_term.py``, where every lab's
    graded cases also fail on the stubs with the not-implemented hint (the handout's plain
    ``pytest``); every lab passes there, so no run of every lab on the solutions is needed here."""
    assert sorted(STUDENT_COMMANDS) == sorted(student_command(lab) for lab in syllabus.LABS), (
        f"the documents print student commands the term does not run: {STUDENT_COMMANDS}")


# A grader's command (a submission's path in place of the placeholder) runs on a copy of the
# solutions; every lab's stubs are covered by the students' commands in the term.
@pytest.mark.slow
@pytest.mark.parametrize("command", GRADER_COMMANDS)
def test_documented_grader_command_passes_on_the_solutions(command, graded_runs):
    process, cases = graded_runs[command]()
    assert process.returncode == 0, process.stdout[-3000:]
    assert_every_case_passes(process, cases, labs_selected(command))


BROKEN_MODULE = "import a_module_that_does_not_exist\n"
WORKING_MODULE = """import pytest

pytestmark = pytest.mark.lab3


def test_one():
    pass
"""


@pytest.mark.slow
def test_the_summary_survives_a_module_that_cannot_be_imported(tmp_path):
    tests = tmp_path / "graded"
    tests.mkdir()
    (tests / "test_lab3_broken.py").write_text(BROKEN_MODULE)
    (tests / "test_lab3_working.py").write_text(WORKING_MODULE)
    process, _ = graded_run(f"pytest {tests}", tmp_path, cwd=tmp_path)
    assert "Traceback" not in process.stderr, process.stderr
    assert "lab3: 1/2 passed" in process.stdout, process.stdout
    assert "could not be collected, counted as failed" in process.stdout
    assert "test_lab3_broken.py" in process.stdout


HIDDEN_MODULE = """import pytest

pytestmark = pytest.mark.lab3


def test_on_another_seed():
    pass


def test_on_another_layout():
    assert False, "lab3: wrong on the strided layout"
"""


@pytest.mark.slow
def test_hidden_checks_are_logged_as_such_and_counted_in_the_summary(tmp_path):
    """Checks in a ``hidden`` folder (the kit's is tests/labs/hidden/) are marked hidden and
    run after the others: the grading log says so for each, a module there that cannot be
    imported included, and the per-lab summary counts them among the lab's tests and apart."""
    tests = tmp_path / "graded"
    (tests / "hidden").mkdir(parents=True)
    (tests / "test_lab3_working.py").write_text(WORKING_MODULE)
    (tests / "hidden" / "test_lab3_hidden.py").write_text(HIDDEN_MODULE)
    (tests / "hidden" / "test_lab3_broken.py").write_text(BROKEN_MODULE)
    log = tmp_path / "log.jsonl"
    process, _ = graded_run(f"pytest {tests} --grading-log {log}", tmp_path, cwd=tmp_path)
    assert "lab3: 2/4 passed (hidden checks among them: 1/3 passed)" in process.stdout, \
        process.stdout
    started = [r["nodeid"].split("/")[-1] for r in read_log(log) if r["event"] == "start"]
    assert started[0] == "test_lab3_working.py::test_one", started
    graded = results_of("kit", ["lab3"], read_log(log), RunEnd(1, False, 0, 0, ""), 0.0)
    assert {test.name: test.hidden for test in graded.tests} == {
        "test_lab3_working.py::test_one": False,
        "test_lab3_hidden.py::test_on_another_seed": True,
        "test_lab3_hidden.py::test_on_another_layout": True,
        "test_lab3_broken.py": True}


def test_the_grader_runs_the_hidden_checks_after_the_public_ones(tmp_path, monkeypatch):
    assert running.HIDDEN_TESTS == REPO / "tests" / "labs" / "hidden"
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in ("test_lab0_hidden.py", "test_lab1_hidden.py"):
        (hidden / name).write_text("")
    monkeypatch.setattr(running, "HIDDEN_TESTS", hidden)
    command = running.graded_run_command(tmp_path, ["lab0"], tmp_path / "log", tmp_path / "ini",
                                         tmp_path, running.Limits())
    files = [argument for argument in command if argument.endswith(".py")]
    public = sorted(str(path) for path in (REPO / "tests" / "labs").glob("test_lab0_*.py"))
    assert public and files == public + [str(hidden / "test_lab0_hidden.py")], files


def a_hang_in_a_hidden_check() -> Graded:
    """A graded run's log: a public check passed, a hidden one hung."""
    public, secret = ("tests/labs/test_lab0_a.py::test_public",
                      "tests/labs/hidden/test_lab0_hidden.py::test_secret_seed")
    records = [{"event": "collected", "tests": [
                   {"nodeid": public, "lab": "lab0", "hidden": False},
                   {"nodeid": secret, "lab": "lab0", "hidden": True}]},
               {"event": "report", "nodeid": public, "lab": "lab0", "phase": "call",
                "outcome": "passed", "duration": 1.0},
               {"event": "hang", "nodeid": secret, "world_size": 4},
               {"event": "report", "nodeid": secret, "lab": "lab0", "phase": "call",
                "hidden": True, "outcome": "failed", "duration": 4.0,
                "message": "E   LaunchTimeout: did not finish within 4 s"},
               {"event": "finished", "exitstatus": 1}]
    graded = results_of("student", ["lab0"], records, RunEnd(1, False, 900, 30, ""), 5.0)
    score(graded, Points())
    return graded


def test_gradescope_shows_a_hidden_check_after_the_due_date_and_never_names_it_before():
    result = reports.gradescope(a_hang_in_a_hidden_check())
    assert [(test["name"], test["visibility"]) for test in result["tests"]] == [
        ("test_lab0_a.py::test_public", "visible"),
        ("test_lab0_hidden.py::test_secret_seed", "after_due_date")]
    assert "did not finish within 4 s" in result["tests"][1]["output"]
    # The submission's output, shown at once, says where it hung without the check's name.
    assert "a hidden check of lab0" in result["output"] and "secret" not in result["output"]


def test_the_sheet_counts_public_and_hidden_points_apart():
    row, = reports.sheet_rows(a_hang_in_a_hidden_check(), ["lab0"])
    assert list(row) == reports.SHEET_COLUMNS
    assert {column: row[column] for column in reports.SHEET_COLUMNS[2:6]} == {
        "passed": 1, "total": 2, "score": 1, "max_score": 2}
    assert {column: row[column] for column in reports.SHEET_COLUMNS[8:]} == {
        "public_score": 1, "public_max": 1, "hidden_score": 0, "hidden_max": 1,
        "hidden_passed": 0, "hidden_total": 1}


@pytest.mark.slow
def test_a_missing_file_in_a_submission_is_named(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/labs/test_lab0_collectives.py", "--impl",
         str(tmp_path), "-p", "no:cacheprovider", "-q", "-x"],
        cwd=REPO, capture_output=True, text=True, timeout=nested.LIMIT)
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


def test_a_student_file_imports_its_own_lab_s_files_and_the_reference_of_others():
    tp_layers = (REPO / "labs" / "tp_layers.py").read_text()  # lab 2
    assert "from tp_collectives import" in tp_layers  # lab 2: the student's own
    assert "from reference_impl.model import" in tp_layers  # no exercises: the reference
    tp_attention = (REPO / "labs" / "tp_attention.py").read_text()  # lab 3
    assert "from reference_impl.tp.tp_layers import" in tp_attention  # lab 2's reference


@pytest.mark.slow
def test_a_graded_submission_s_files_compose(tmp_path):
    """In a graded rank, the submission's ``tp_layers`` runs on the submission's own
    ``tp_collectives`` (one module object), found in the submission's folder."""
    shutil.copytree(REPO / "labs", tmp_path / "submission")
    probe = ("from reference_impl.course.grading import Implementation\n"
             "impl = Implementation.from_option(sys.argv[1]); impl.enter()\n"
             "layers, collectives = impl.module('tp_layers'), impl.module('tp_collectives')\n"
             "assert layers.copy_to_tp is collectives.copy_to_tp\n"
             "print(collectives.__file__)\n")
    done = subprocess.run([sys.executable, "-c", "import sys\n" + probe,
                           str(tmp_path / "submission")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "submission" / "tp_collectives.py")


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


def test_a_marker_s_hint_longer_than_the_limit_is_refused(tmp_path):
    """A marker's hint names the exercise and its folded hint in the notebook; prose in it
    is refused, with the file, the line, the length and the limit."""
    limit = make_labs.HINT_LIMIT
    module = tmp_path / "example.py"
    region = "def f():\n    # BEGIN SOLUTION lab1: {}\n    return 1\n    # END SOLUTION\n"
    module.write_text(region.format("x" * (limit + 1)))
    with pytest.raises(ValueError, match=rf"example\.py:2: .* {limit + 1} characters, over the "
                                         rf"limit of {limit}"):
        make_labs.student_module(module)
    module.write_text(region.format("x" * limit))
    assert f"raise NotImplementedError('lab1: {'x' * limit}')" in make_labs.student_module(module)


def test_every_marker_s_hint_is_a_folded_hint_of_its_lab_s_notebook():
    """``name (hint: "title" in the notebook)``: the title is in a ``<summary>`` of the
    lab's solved notebook, so a student finds the hint from the stub's message."""
    begin = re.compile(r"^\s*# BEGIN SOLUTION (lab\d+): .*\(hint: \"([^\"]+)\" in the notebook\)$")
    summaries = {lab.marker: re.findall(r"<summary>(.*?)</summary>", "".join(
        cell.source for cell in nbformat.read(REPO / "solutions" / f"{lab.notebook}.ipynb",
                                              as_version=4).cells
        if cell.cell_type == "markdown")) for lab in syllabus.LABS}
    unnamed = []
    for path in make_labs.modules_with_exercises():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "# BEGIN SOLUTION" in line:
                marker = begin.match(line)
                if not (marker and any(marker[2] in title for title in summaries[marker[1]])):
                    unnamed.append(f"{path.name}:{number}")
    assert not unnamed, f"markers whose hint names no folded hint of their notebook: {unnamed}"


def test_notebook_solutions_answers_outputs_and_imports_are_replaced(tmp_path):
    notebook = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell(
        "from reference_impl.comm.groups import build_rank_layout\n"
        "from reference_impl.comm.launcher import launch\n"
        "### BEGIN SOLUTION: predict the sum\npredicted = 6\n### END SOLUTION\nprint(predicted)")
    code.outputs = [nbformat.v4.new_output("stream", text="6\n")]
    code.execution_count = 3
    answer = nbformat.v4.new_markdown_cell("Why?\n<!-- BEGIN SOLUTION -->\nBecause.\n"
                                           "<!-- END SOLUTION -->")
    notebook.cells = [code, answer]
    path = tmp_path / "lab9_example.ipynb"
    nbformat.write(notebook, path)
    student = nbformat.reads(make_labs.student_notebook(path, ["groups"]), as_version=4)
    assert student.cells[0].source == make_labs.STUDENT_PATH_SETUP + (
        "from groups import build_rank_layout\nfrom reference_impl.comm.launcher import launch\n"
        "# YOUR CODE HERE\nraise NotImplementedError('predict the sum')\nprint(predicted)")
    assert student.cells[0].outputs == [] and student.cells[0].execution_count is None
    assert student.cells[1].source == "Why?\n*Your answer here.*"


TIMING_MODULE = """import pytest


@pytest.mark.alone
def test_times_something():
    pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("worker", [None, "gw0"], ids=["alone", "xdist worker"])
def test_a_timing_test_is_skipped_only_where_other_tests_share_its_cores(tmp_path, worker):
    (tmp_path / "test_timing.py").write_text(TIMING_MODULE)
    environment = {key: value for key, value in os.environ.items()
                   if key != "PYTEST_XDIST_WORKER"}
    if worker:
        environment["PYTEST_XDIST_WORKER"] = worker
    process = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path), "-p", "no:cacheprovider", "-q", "-rs",
         "-o", "addopts=", "-W", "error::pytest.PytestUnknownMarkWarning"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=nested.LIMIT)
    expected = "1 skipped" if worker else "1 passed"
    assert expected in process.stdout, process.stdout[-2000:]
    if worker:
        assert "compares wall-clock times: run it without -n" in process.stdout


def test_the_launch_limit_counts_the_imports_and_caps_a_test_s_own_longer_limit(tmp_path):
    """A submission that sleeps at import, graded with ``--launch-timeout 5``: a test whose own
    limit is 90 s (the ring's phases) stops at 5 s, since the launch's clock starts before the
    submission's code first runs."""
    folder = tmp_path / "labs"
    folder.mkdir()
    for module in make_labs.modules_with_exercises():
        shutil.copy(module, folder / module.name)
    collectives = folder / "collectives.py"
    collectives.write_text(collectives.read_text() + "\nimport time\ntime.sleep(600)\n")
    process, cases = graded_run(f"pytest --impl {folder} -m lab0 -k 'reduce_scatter_phase and "
                                "4-ranks' --launch-timeout 5", tmp_path)
    assert cases, process.stdout[-3000:]
    for case in cases.values():
        failure = failure_text(case)
        assert failure and "did not finish within 5 s" in failure, (failure or "passed")[:2000]
