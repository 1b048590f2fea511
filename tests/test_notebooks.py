"""The student notebooks in ``labs/`` work as handed out: every solved notebook has a student
version, and each student version runs, with the student's untouched files next to it, up to
its first exercise, and stops there with the exercise's ``NotImplementedError``.

A cell that fails before the first exercise (a broken import rewrite, a helper that needs a
solution, a typo) would stop a student before they could start; these tests catch that. The
solved notebooks themselves are checked by nbval (``pytest solutions/``).
"""
import re
from pathlib import Path

import ipykernel.kernelspec
import nbformat
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"
LABS = REPO / "labs"
SOLVED = sorted(path.name for path in SOLUTIONS.glob("lab*.ipynb"))
CELL_TIMEOUT = 120  # seconds; the cells before a lab's first exercise take a few seconds
STUB = "raise NotImplementedError"
REGENERATE = "run `python -m reference_impl.course.make_labs` to regenerate labs/"

_THIS_ENV = "python3-this-environment"
_ANSI_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


class _ThisEnvironmentKernels(KernelSpecManager):
    """Run notebooks on this interpreter (the one with the kit installed), whatever kernels
    the machine has registered; nbval's --nbval-current-env does the same."""

    def get_kernel_spec(self, kernel_name):
        if kernel_name == _THIS_ENV:
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())
        return super().get_kernel_spec(kernel_name)


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

    kernel = KernelManager(kernel_name=_THIS_ENV, kernel_spec_manager=_ThisEnvironmentKernels())
    client = NotebookClient(notebook, km=kernel, timeout=CELL_TIMEOUT,
                            resources={"metadata": {"path": str(LABS)}})  # cwd = labs/
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as error:
                assert error.ename == "NotImplementedError", (
                    f"labs/{name}, cell {index} failed before the student reached an exercise "
                    f"(it should run on the untouched student files):\n"
                    f"{_ANSI_COLOURS.sub('', str(error))}")
                return  # the first exercise: the student takes over from here
    pytest.fail(f"labs/{name} ran to the end without reaching an exercise: is a solution "
                f"left in it? (exercise stubs are in cells {stubs}) {REGENERATE}")
