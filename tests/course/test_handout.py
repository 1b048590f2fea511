"""The student handout (``python -m reference_impl.course.handout``): no solution line of a
withheld lab in it, released labs keep theirs, and a notebook, its ranks and a withheld module's
command line get the student's file where the library imports a withheld module; its README's
set-up check passes, it has one pytest configuration, naming only files it has, and its pages
link only to files it has. (The graded tests and notebooks in the handout, lab by lab, and a
plain ``pytest`` in a fresh one: ``tests/course/test_term.py``.)"""
import re
import shutil

import nbformat
import pytest

from support.handout_runs import build_handout, handout_python, in_handout
from reference_impl.course import handout, make_labs, syllabus
from support import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def start_of_term(tmp_path_factory):
    """The handout the README's command builds, run verbatim."""
    return build_handout(tmp_path_factory.mktemp("instructor"))


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    """A Python that sees the handout's library only."""
    return handout_python(tmp_path_factory.mktemp("python"))


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


def test_the_hidden_checks_stay_with_the_grader():
    """tests/labs/hidden/ (the batch grader's hidden tier) is in no handout, all labs released
    or none; the public graded tests are."""
    last = max(lab.number for lab in syllabus.LABS) + 1
    for first_withheld in (0, last):
        assert handout.left_out("tests/labs/hidden/test_lab0_hidden.py", first_withheld)
        assert handout.left_out("tests/labs/hidden/conftest.py", first_withheld)
        assert not handout.left_out("tests/labs/test_lab0_collectives.py", first_withheld)


def test_a_figure_that_replays_an_exercise_ships_with_its_lab():
    """The ring all-reduce figure replays lab 0's chunk indices: out while lab 0 is withheld."""
    figure = "reference_impl/figures/ring_all_reduce.py"
    assert handout.left_out(figure, 0)
    assert not handout.left_out(figure, 1)
    assert not handout.left_out("reference_impl/figures/zero_partitions.py", 0)


def test_the_handout_has_the_public_graded_tests_only(start_of_term):
    assert (start_of_term / "tests" / "labs" / "test_lab0_collectives.py").is_file()
    assert not (start_of_term / "tests" / "labs" / "hidden").exists()


def test_in_the_handout_a_notebook_and_its_ranks_use_the_student_s_file(start_of_term, python):
    """Lab 2 withheld: where the library or a later lab's notebook imports its module, the
    student's ``labs/tp_layers.py`` is that module, in the notebook and in its ranks."""
    process = in_handout(python, start_of_term, [str(python), "-c", NOTEBOOK_PROBE], timeout=120)
    assert process.returncode == 0, process.stderr[-3000:]
    mine = str(start_of_term / "labs" / "tp_layers.py")
    assert process.stdout.strip() == f"True (True, '{mine}')", process.stdout


def test_released_labs_keep_their_solutions(tmp_path):
    release = tmp_path / "after_lab2"
    names = handout.build(release, first_withheld=3)
    assert "tp_layers" not in names and "tp_attention" in names
    assert (release / "reference_impl/tp/tp_layers.py").read_text() == (
        REPO / "reference_impl/tp/tp_layers.py").read_text()
    assert (release / "solutions/lab2_tp_layers.ipynb").exists()
    assert not (release / "solutions/lab3_tp_attention.ipynb").exists()
    decks = sorted(path.name for path in release.glob("slides/*.ipynb"))
    assert decks == ["lab0_collectives.ipynb", "lab1_rank_groups.ipynb", "lab2_tp_layers.ipynb"]
    listed = re.findall(r"^\| `(lab\d+_\w+\.ipynb)` \|", (release / "slides/README.md").read_text(),
                        re.MULTILINE)
    assert listed == decks, f"slides/README.md lists {listed}, the release has {decks}"
    assert "tests/course" not in (release / "slides/README.md").read_text()
    assert "Labs 0 to 2 are released" in (release / "README.md").read_text()
    assert handout.broken_links(release) == []


# ------------------------------------------------------------ what a student finds in it

def test_the_readme_s_set_up_check_passes(start_of_term, python):
    """The set-up commands of the handout's README, as printed (the install aside: the test's
    Python has the kit's dependencies already)."""
    readme = (start_of_term / "README.md").read_text()
    block = re.search(r"^## Set up\n.*?^```bash\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
    commands = [line for line in block.group(1).splitlines() if not line.startswith("pip ")]
    assert commands == ["python -m reference_impl.course.setup_check"], commands
    process = in_handout(python, start_of_term, commands[0], timeout=120)
    assert process.returncode == 0, process.stdout + process.stderr[-3000:]
    assert process.stdout.count("ok: ") == 3 and "ready for the labs" in process.stdout


def test_the_readme_s_check_command_runs_as_printed_on_the_student_s_files(start_of_term, python):
    """The handout README's own command (a plain ``pytest``: its pytest.ini checks labs/), on
    the untouched stubs: every check of lab 0 fails at an exercise's hint."""
    readme = (start_of_term / "README.md").read_text()
    (command,) = re.findall(r"^pytest -m lab0$", readme, re.MULTILINE)
    process = in_handout(python, start_of_term, command, timeout=300)
    assert process.returncode == 1, process.stdout[-3000:] + process.stderr[-3000:]
    assert "lab0: not started (0/" in process.stdout, process.stdout[-3000:]


def test_the_readme_is_for_students(start_of_term):
    readme = (start_of_term / "README.md").read_text()
    assert "\npytest -m lab0\n" in readme and "not started" in readme
    assert "--impl labs" not in readme  # its pytest.ini sets it: a plain pytest checks your files
    for maintainer_matter in ("tests/course", "tests/library", "maintaining", "For graders",
                              "For instructors", "whole suite"):
        assert maintainer_matter not in readme, maintainer_matter


def test_one_pytest_configuration_naming_only_files_the_handout_has(start_of_term):
    """pytest reads pytest.ini; the kit's pyproject section (the whole suite, the solved
    notebooks, nbval's sanitizer file) is not there to be ignored with a warning."""
    assert "[tool.pytest" not in (start_of_term / "pyproject.toml").read_text()
    assert not any((start_of_term / name).exists() for name in ("setup.cfg", "tox.ini"))
    ini = (start_of_term / "pytest.ini").read_text()
    paths = re.findall(r"^testpaths = (.*)$", ini, re.MULTILINE)[0].split()
    assert paths and all((start_of_term / path).is_dir() for path in paths), ini
    assert re.search(r"^impl = labs$", ini, re.MULTILINE), ini


def test_the_handout_s_pages_link_only_to_files_it_has(start_of_term):
    assert handout.broken_links(start_of_term) == []
    for instructor_only in ("docs/teaching.md", "docs/grading.md", "docs/maintaining.md", ".ci",
                            "slides"):
        assert not (start_of_term / instructor_only).exists(), instructor_only


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "[here](page.md), [up](../README.md), [web](https://pytorch.org), `[code](gone.md)`\n")
    assert handout.broken_links(tmp_path) == ["docs/page.md: ../README.md"]


def test_a_withheld_module_s_command_runs_the_student_s_file(start_of_term, python, tmp_path):
    """``python -m reference_impl.comm.groups`` as ``labs/groups.py`` prints it, lab 1 withheld:
    the student's finished file runs, not the library's stub."""
    student = shutil.copytree(start_of_term, tmp_path / "handout", symlinks=True)
    solved = {path.name: text for path, text in make_labs.student_files(solved=True).items()}
    (student / "labs" / "groups.py").write_text(solved["groups.py"])
    command = re.search(r"``(python -m reference_impl\.comm\.groups [^`]+)``",
                        (student / "labs" / "groups.py").read_text()).group(1)
    process = in_handout(python, student, command, timeout=120)
    assert process.returncode == 0, process.stderr[-3000:]
    assert "GPU1: pp_rank 1, tp_rank 0" in process.stdout, process.stdout

