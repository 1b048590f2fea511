"""The student handout (``python -m reference_impl.course.handout``): no solution line of a
withheld lab in it, released labs keep theirs, and a notebook and its ranks get the student's
file where the library imports a withheld module. (The graded tests and notebooks in the
handout, lab by lab: ``tests/course/test_term.py``.)"""
import re

import nbformat
import pytest

from support.handout_runs import build_handout, handout_python, in_handout
from reference_impl.course import handout, make_labs
from support import REPO

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def start_of_term(tmp_path_factory):
    """The handout the README's command builds, run verbatim."""
    return build_handout(tmp_path_factory.mktemp("instructor"))


def secret_lines() -> set[str]:
    """Lines of every lab's solutions that appear nowhere else in the kit (outside notebooks):
    inside the solution regions of the reference modules and of the solved notebooks' cells."""
    secret, public = set(), set()
    for path in make_labs.modules_with_exercises():
        for _, lines in make_labs.solution_regions(path.read_text()):
            secret.update(line.strip() for line in lines)
        public.update(line.strip() for line in make_labs.stubbed_source(path).splitlines())
    exercises = {path.relative_to(REPO).as_posix() for path in make_labs.modules_with_exercises()}
    for name in handout.tracked_files():  # everything else of the kit is public anyway
        if name not in exercises and not name.endswith(".ipynb"):
            public.update(line.strip() for line in (REPO / name).read_text(
                errors="ignore").splitlines())
    for path in (REPO / "solutions").glob("lab*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            for region in re.findall(r"### BEGIN SOLUTION.*?\n(.*?)### END SOLUTION", cell.source,
                                     re.DOTALL):
                secret.update(line.strip() for line in region.splitlines())
    return {line for line in secret - public if len(line) >= 12 and not line.startswith("#")}


def test_no_solution_line_is_in_the_handout(start_of_term):
    secret = secret_lines()
    assert len(secret) > 50  # the check has something to find
    for path in start_of_term.rglob("*"):
        if path.is_file():
            found = secret & {line.strip() for line in path.read_text(errors="ignore").splitlines()}
            assert not found, f"{path.relative_to(start_of_term)} holds solution lines: {found}"
    assert not list(start_of_term.glob("solutions/*.ipynb"))
    assert not list(start_of_term.glob("slides/*.ipynb"))


NOTEBOOK_PROBE = """
from reference_impl.course.own_files import use_my_files
use_my_files()  # a student notebook's first line
import reference_impl.tp.tp_layers as library_s, tp_layers as mine
from reference_impl.comm.launcher import launch

def probe():
    import reference_impl.tp.tp_layers as library_s, tp_layers as mine
    return library_s is mine, mine.__file__

print(library_s is mine, launch(probe, 1)[0])
"""


def test_in_the_handout_a_notebook_and_its_ranks_use_the_student_s_file(start_of_term,
                                                                        tmp_path):
    """Lab 2 withheld: where the library or a later lab's notebook imports its module, the
    student's ``labs/tp_layers.py`` is that module, in the notebook and in its ranks."""
    python = handout_python(tmp_path / "python")
    process = in_handout(python, start_of_term, [str(python), "-c", NOTEBOOK_PROBE], timeout=120)
    assert process.returncode == 0, process.stderr[-3000:]
    mine = str(start_of_term / "labs" / "tp_layers.py")
    assert process.stdout.strip() == f"True (True, '{mine}')", process.stdout


def test_released_labs_keep_their_solutions(tmp_path):
    names = handout.build(tmp_path / "after_lab2", first_withheld=3)
    assert "tp_layers" not in names and "tp_attention" in names
    assert (tmp_path / "after_lab2" / "reference_impl/tp/tp_layers.py").read_text() == (
        REPO / "reference_impl/tp/tp_layers.py").read_text()
    assert (tmp_path / "after_lab2" / "solutions/lab2_tp_layers.ipynb").exists()
    assert not (tmp_path / "after_lab2" / "solutions/lab3_tp_attention.ipynb").exists()
