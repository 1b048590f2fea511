"""What a submission's code sees of the kit while it is graded: a student's view. The modules of
the graded labs read as their stubs (under any name they are imported by), the hidden checks,
the kit's history and its own tests are empty folders, and the hidden checks still run, their
functions sent by value."""
import json
import subprocess
import sys

import pytest

from reference_impl.course import make_labs, view
from reference_impl.course.sandboxing import probe
from support import REPO, nested
from support.graded_cases import copy_of

ACCUMULATE = "chunks[receive_index] += received"  # a line of lab 0's solution
HIDDEN_SOURCE = view.HIDDEN_CHECKS / "test_lab0_hidden.py"
SOLUTION = REPO / "reference_impl" / "comm" / "collectives.py"
SELECTED = "test_ring_all_reduce_on_3_ranks or test_hidden_ring_chunks"

# A student file that hands in the reference instead of its own work, by a name no reader of
# its source can see and then by its file, and reports what it can read of the grader's kit.
PEEKER = f'''
import importlib as _importlib, importlib.util, os as _os

_seen = [_path for _path in ({str(HIDDEN_SOURCE)!r}, {str(REPO / ".git" / "HEAD")!r},
                             {str(REPO / "tests" / "course")!r})
         if _os.path.exists(_path) and (_os.path.isfile(_path) or _os.listdir(_path))]
_solution = open({str(SOLUTION)!r}).read()
if _seen or {ACCUMULATE!r} in _solution:
    raise RuntimeError(f"the grader's kit in view: {{_seen}}, solution: {{{ACCUMULATE!r} in _solution}}")
_by_name = _importlib.import_module(".".join(["reference_impl", "comm", "collectives"]))
if _by_name is not _importlib.import_module(__name__):
    raise RuntimeError("the reference's name is not the submission's own module")
_spec = _importlib.util.spec_from_file_location("_reference", {str(SOLUTION)!r})
_reference = _importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_reference)  # by its file, past every import hook
globals().update({{_name: _value for _name, _value in vars(_reference).items()
                  if not _name.startswith("__")}})
'''


def test_the_graded_labs_modules_read_as_their_stubs_and_their_solved_notebooks_as_empty(
        tmp_path):
    replaced = dict(view.replaced_files(["lab0"], tmp_path))
    stub = open(replaced[str(SOLUTION)]).read()
    assert ACCUMULATE not in stub and "raise NotImplementedError('lab0: ring_chunks" in stub
    assert stub == make_labs.stubbed_source(SOLUTION, {"lab0"})
    for name in ("solutions/lab0_collectives.ipynb", "slides/lab0_collectives.ipynb"):
        assert open(replaced[str(REPO / name)]).read() == ""
    assert not any("tp_layers" in target or "lab2" in target for target in replaced)  # lab 2
    assert str(view.HIDDEN_CHECKS) in view.hidden_folders()
    assert str(REPO / "tests" / "course") in view.hidden_folders()


@pytest.mark.skipif(probe() is not None, reason=f"no sandbox here: {probe()}")
def test_a_submission_that_imports_the_reference_by_a_computed_name_gets_the_stub(tmp_path):
    submission = copy_of("solutions", tmp_path / "peeker")
    (submission / "collectives.py").write_text(PEEKER)
    log = tmp_path / "log.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:nbval", "-p", "no:cacheprovider", "-o",
         "addopts=", "-q", "tests/labs", "--impl", str(submission), "-m", "lab0", "-k", SELECTED,
         "--grading-log", str(log), "--sandbox", "namespaces"],
        cwd=REPO, capture_output=True, text=True, timeout=nested.LIMIT)
    reports = {record["nodeid"].split("::")[-1]: record
               for line in log.read_text().splitlines() for record in [json.loads(line)]
               if record.get("event") == "report" and record.get("phase") == "call"}
    assert set(reports) == set(SELECTED.split(" or ")), run.stdout[-3000:]
    for name, record in reports.items():
        assert record["outcome"] == "failed", (name, record)
        assert "the grader's kit in view" not in record["message"], record["message"][-2000:]
        assert "NotImplementedError: lab0: ring_chunks" in record["message"], record["message"]


def test_a_later_lab_s_solutions_are_out_of_view_and_an_earlier_one_s_released():
    students = view.students_view(["lab2"])
    try:
        replaced = dict(students.replaced)
        for later in view.exercise_modules(["lab3", "lab9"]):
            assert str(later) in replaced and later.stem in students.stubbed
        for earlier in view.exercise_modules(["lab0", "lab1"]):
            assert str(earlier) not in replaced and earlier.stem not in students.stubbed
    finally:
        students.close()
