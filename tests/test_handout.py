"""The student handout (``python -m reference_impl.course.handout``): no solution line of a
withheld lab in it, and in it the graded tests fail on the stubs with the contract messages and
pass on the reference modules handed in as a submission, also for a lab that builds on a
withheld one (lab 3 uses lab 2's layers)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from reference_impl.course import handout, make_labs

REPO = Path(__file__).resolve().parents[1]
README_COMMAND = re.search(r"^python -m reference_impl\.course\.handout [^\s#]+",
                           (REPO / "README.md").read_text(), re.MULTILINE).group(0)
LAB3_FEW = ["-m", "lab3", "-k", "block_matches_single_device and h16"]  # tp = 1, 2, 4


@pytest.fixture(scope="module")
def start_of_term(tmp_path_factory):
    """The handout the README's command builds, run verbatim."""
    where = tmp_path_factory.mktemp("instructor")
    process = subprocess.run(README_COMMAND, shell=True, cwd=where, capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{Path(sys.executable).parent}"
                                                        f"{os.pathsep}{os.environ['PATH']}"})
    assert process.returncode == 0, process.stderr
    return where / README_COMMAND.split()[-1]


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


def in_handout(folder: Path, *arguments):
    environment = {**os.environ, "PYTHONPATH": str(folder)}  # the handout's library, not the kit's
    environment.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           *arguments], cwd=folder, env=environment, capture_output=True,
                          text=True, timeout=600)


def test_in_the_handout_the_stubs_fail_with_the_contract_message(start_of_term):
    process = in_handout(start_of_term, "--impl", "labs", *LAB3_FEW)
    assert process.returncode != 0
    assert "lab3: 0/3 passed" in process.stdout, process.stdout[-2000:]
    assert "NotImplementedError: lab3:" in process.stdout


def test_in_the_handout_the_reference_handed_in_passes(start_of_term, tmp_path):
    for module in make_labs.modules_with_exercises():
        shutil.copy(module, tmp_path / module.name)
    process = in_handout(start_of_term, "--impl", str(tmp_path), *LAB3_FEW)
    assert process.returncode == 0, process.stdout[-3000:]
    assert "lab3: 3/3 passed" in process.stdout


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


def test_in_the_handout_a_notebook_and_its_ranks_use_the_student_s_file(start_of_term):
    """Lab 2 withheld: where the library or a later lab's notebook imports its module, the
    student's ``labs/tp_layers.py`` is that module, in the notebook and in its ranks."""
    environment = {**os.environ, "PYTHONPATH": str(start_of_term)}
    process = subprocess.run([sys.executable, "-c", NOTEBOOK_PROBE], cwd=start_of_term,
                             env=environment, capture_output=True, text=True, timeout=120)
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
