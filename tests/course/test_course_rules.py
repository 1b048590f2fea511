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
GRADED = sorted(GRADED_TESTS.glob("test_lab*_*.py"))


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
def test_a_graded_test_imports_only_what_the_handout_carries(path):
    carried = {"support", "support.toys"}  # reference_impl.course.handout.GRADED_TESTS
    for node in ast.walk(ast.parse(path.read_text())):
        for module in modules_imported(node):
            assert module.split(".")[0] != "support" or ".".join(module.split(".")[:2]) in carried, (
                f"{path.name} line {node.lineno} imports {module}: the student handout carries "
                f"tests/labs/ and of tests/support only {sorted(carried)}")


def test_the_implementation_is_not_loaded_in_pytest_s_process(tmp_path):
    for implementation in (Implementation("reference"), Implementation(str(tmp_path))):
        with pytest.raises(SubmissionOutsideItsProcess, match="run_on_ranks or run_alone"):
            implementation.module("collectives")
