"""The student notebooks in ``labs/`` work as handed out: every solved notebook has a student
version, and each student version runs, with the student's untouched files next to it, up to
its first exercise, and stops there with the exercise's ``NotImplementedError`` (raised in the
notebook, or in the ranks a cell launches).

A cell that fails before the first exercise (a broken import rewrite, a helper that needs a
solution, a typo) would stop a student before they could start; these tests catch that. The
solved notebooks themselves are checked by nbval (``pytest solutions/``).
"""
import re

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError

from reference_impl.course.kernel import notebook_client
from support import REPO

pytestmark = pytest.mark.slow

SOLUTIONS = REPO / "solutions"
LABS = REPO / "labs"
SOLVED = sorted(path.name for path in SOLUTIONS.glob("lab*.ipynb"))
STUB = "raise NotImplementedError"
REGENERATE = "run `python -m reference_impl.course.make_labs` to regenerate labs/"

_ANSI_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def test_every_solved_notebook_has_a_student_notebook():
    assert SOLVED, f"no solved notebooks (lab*.ipynb) in {SOLUTIONS}"
    missing = [name for name in SOLVED if not (LABS / name).exists()]
    assert not missing, f"labs/ lacks the student version of {', '.join(missing)}: {REGENERATE}"


@pytest.mark.parametrize("name", SOLVED)
def test_student_notebook_runs_up_to_its_first_exercise(name):
    path = LABS / name
    assert path.exists(), f"labs/{name} is missing: {REGENERATE}"
    notebook = nbformat.read(path, as_version=4)
    stubs = [index for index, cell in enumerate(notebook.cells)
             if cell.cell_type == "code" and STUB in cell.source]
    assert stubs, f"labs/{name} has no exercise (no code cell with `{STUB}`): {REGENERATE}"

    client = notebook_client(notebook, cwd=LABS)
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as error:
                in_a_rank = error.ename == "RankFailure" and "NotImplementedError: lab" in str(
                    error.evalue)  # a stub called on the ranks a cell launched
                assert error.ename == "NotImplementedError" or in_a_rank, (
                    f"labs/{name}, cell {index} failed before the student reached an exercise "
                    f"(it should run on the untouched student files):\n"
                    f"{_ANSI_COLOURS.sub('', str(error))}")
                return  # the first exercise: the student takes over from here
    pytest.fail(f"labs/{name} ran to the end without reaching an exercise: is a solution "
                f"left in it? (exercise stubs are in cells {stubs}) {REGENERATE}")
