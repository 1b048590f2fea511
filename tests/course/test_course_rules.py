"""The rules graded tests keep (see reference_impl.course.grading): a graded test never imports
the reference module of the lab it grades, and never loads the implementation in pytest's own
process."""
import ast
import re

import pytest

from reference_impl.course.grading import (
    Implementation, SubmissionOutsideItsProcess, modules_imported, reference_module_name)
from reference_impl.course.make_labs import labs_of_modules

from support import GRADED_TESTS
# Both tiers: the hidden checks too run where the graded lab's reference is a stub (the
# Gradescope autograder's kit is a handout).
GRADED = sorted([*GRADED_TESTS.glob("test_lab*_*.py"), *GRADED_TESTS.glob("hidden/test_lab*_*.py")])


def test_there_are_graded_test_files():
    assert {re.match(r"test_(lab\d+)_", path.name).group(1) for path in GRADED} >= {
        lab for labs in labs_of_modules().values() for lab in labs}


@pytest.mark.parametrize("path", GRADED, ids=lambda path: path.name)
def test_a_graded_test_does_not_import_the_solution_it_grades(path):
    lab = re.match(r"test_(lab\d+)_", path.name).group(1)
    graded = {reference_module_name(name): name for name, labs in labs_of_modules().items()
              if lab in labs}
    for node in ast.walk(ast.parse(path.read_text())):
        for module in modules_imported(node):
            assert module not in graded, (
                f"{path.name} line {node.lineno} imports {module}, the reference of {lab}'s "
                f"{graded[module]}.py: in a student handout it is a stub. Compare with the "
                "single-device model, a formula or values computed in the test, and reach the "
                f"implementation through impl.module({graded[module]!r}) inside a rank "
                "function")


@pytest.mark.parametrize("path", GRADED, ids=lambda path: path.name)
def test_a_graded_test_imports_nothing_of_the_tests_folder(path):
    """The handout carries tests/labs/ alone, and a grader may run the graded tests under any
    pytest configuration: tests/support is on the path only under the kit's own."""
    for node in ast.walk(ast.parse(path.read_text())):
        for module in modules_imported(node):
            assert module.split(".")[0] not in {"support", "tests"}, (
                f"{path.name} line {node.lineno} imports {module}: graded tests import the kit "
                f"(reference_impl) and nothing of tests/")


def test_the_implementation_is_not_loaded_in_pytest_s_process(tmp_path):
    for implementation in (Implementation("reference"), Implementation(str(tmp_path))):
        with pytest.raises(SubmissionOutsideItsProcess, match="run_on_ranks or run_alone"):
            implementation.module("collectives")
