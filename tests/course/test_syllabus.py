"""The course's facts live in ``reference_impl/course/syllabus.py``; what states them elsewhere
agrees with it: the README's course map, the grading page's GPU list, the notebooks' stated times, the
solution markers of the reference modules. (The GPUs are checked against the world sizes the
graded tests launch in ``tests/course/test_term.py``.)"""
import re

import nbformat
import pytest

from support import documents
from reference_impl.course import make_labs, syllabus

from support import REPO
README = (REPO / "README.md").read_text()


def course_map() -> dict[int, list[str]]:
    """The README's course map: lab number -> its row's cells."""
    section = README.split("## Course map\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines()
            if re.match(r"^\| \d+ \|", line)]
    return {int(cells[0]): [cell.strip() for cell in cells] for cells in rows}


def test_the_course_map_has_every_lab_with_its_topic_files_and_time():
    rows = course_map()
    assert sorted(rows) == [lab.number for lab in syllabus.LABS]
    for lab in syllabus.LABS:
        number, topic, you_write, _, time, builds_on = rows[lab.number]
        assert topic == lab.topic, f"lab {number}: README says {topic!r}, the syllabus {lab.topic!r}"
        files = re.findall(r"`(\w+)\.py`", you_write)
        assert files == list(lab.files), (f"lab {number}: the README's 'you write' names "
                                          f"{files}, the syllabus {list(lab.files)}")
        assert time == f"{lab.minutes} min", f"lab {number}: README {time!r}, syllabus {lab.minutes}"
        assert builds_on == lab.earlier_labs, (f"lab {number}: README builds on {builds_on!r}, "
                                               f"the syllabus on {lab.earlier_labs!r}")


def test_the_grading_page_lists_the_gpus_of_every_lab():
    sentence = re.search(r"GPUs each lab's tests need under NCCL[^:]*:(.*?)\.\s",
                         documents.text(), re.DOTALL)
    assert sentence, "the documents' sentence on the GPUs each lab needs is missing"
    stated = {int(n): int(g) for n, g in re.findall(r"lab (\d+): (\d+)", sentence.group(1))}
    assert stated == {lab.number: lab.gpus for lab in syllabus.LABS}


@pytest.mark.parametrize("folder", ["solutions", "labs"])
def test_every_notebook_states_the_labs_it_builds_on(folder):
    for lab in syllabus.LABS:
        first = nbformat.read(REPO / folder / f"{lab.notebook}.ipynb", as_version=4).cells[0].source
        assert f"**Builds on:** {lab.needs}." in first, (
            f"{folder}/{lab.notebook}.ipynb: its first cell should say '**Builds on:** "
            f"{lab.needs}.' (the syllabus)")


@pytest.mark.parametrize("folder", ["solutions", "labs"])
def test_every_notebook_states_its_lab_s_time(folder):
    for lab in syllabus.LABS:
        path = REPO / folder / f"{lab.notebook}.ipynb"
        assert path.exists(), f"{path.relative_to(REPO)} is missing (syllabus: {lab.notebook})"
        first = nbformat.read(path, as_version=4).cells[0].source
        stated = re.search(r"\*\*Estimated time:\*\* (\d+) minutes", first)
        assert stated and int(stated[1]) == lab.minutes, (
            f"{path.relative_to(REPO)}: its first cell should say '**Estimated time:** "
            f"{lab.minutes} minutes.' (the syllabus), not {stated and stated[0]!r}")


def test_the_solution_markers_put_each_lab_s_exercises_in_its_files():
    make_labs.check_markers(syllabus.labs_of_files())
    with pytest.raises(ValueError, match="tp_layers: markers .'lab2'., syllabus .'lab3'."):
        make_labs.check_markers({**syllabus.labs_of_files(), "tp_layers": ["lab3"]})


def test_a_lab_that_is_not_there_is_named_with_the_labs_that_are():
    with pytest.raises(ValueError, match="no lab 'lab99': the labs are lab0, lab1,"):
        syllabus.lab("lab99")
