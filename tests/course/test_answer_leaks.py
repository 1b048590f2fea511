"""The answer-leak check the handout build runs (reference_impl/course/answer_leaks.py): a
solution line found however it is indented or wrapped, named with its file and lab; short
lines, comments and released labs' lines left alone. Every lab asks for at least 40 lines."""
import pytest

from reference_impl.course import answer_leaks, syllabus

LABS = {lab.marker for lab in syllabus.LABS}


def a_long_solution_line(lab: str) -> str:
    found = [line for lab_of, line in answer_leaks.solution_lines({lab}).values()]
    assert found, f"{lab} has no solution line of {answer_leaks.LONG}+ characters"
    return max(found, key=len).strip()


def test_a_solution_line_is_found_reindented_and_wrapped(tmp_path):
    line = a_long_solution_line("lab8")
    middle = len(line) // 2
    cut = line.index(" ", middle) if " " in line[middle:] else middle
    (tmp_path / "given.py").write_text(f"def f():\n        {line[:cut]}\n            {line[cut:]}\n")
    (tmp_path / "clean.py").write_text("x = 1\n")
    found = answer_leaks.leaks(tmp_path, ["given.py", "clean.py"], LABS)
    assert [(leak.file, leak.lab) for leak in found] == [("given.py", "lab8")], found
    assert "given.py holds lab8's solution line" in str(found[0])


def test_released_labs_and_short_lines_are_not_answers(tmp_path):
    line = a_long_solution_line("lab3")
    (tmp_path / "given.py").write_text(line + "\n")
    assert answer_leaks.leaks(tmp_path, ["given.py"], LABS - {"lab3"}) == []
    keys = answer_leaks.solution_lines(LABS)
    assert all(len(key) >= answer_leaks.LONG and not key.startswith("#") for key in keys)


def test_a_notebook_s_cells_are_searched(tmp_path):
    line = a_long_solution_line("lab1")
    (tmp_path / "n.ipynb").write_text('{"cells": [{"cell_type": "code", "source": ["'
                                      + line.replace('"', '\\"') + '"]}]}')
    assert [leak.lab for leak in answer_leaks.leaks(tmp_path, ["n.ipynb"], LABS)] == ["lab1"]


@pytest.mark.parametrize("lab", sorted(LABS, key=lambda marker: int(marker[3:])))
def test_every_lab_asks_for_at_least_40_lines(lab):
    written = answer_leaks.written_lines(lab)
    assert written >= 40, f"{lab}: {written} student-written lines, fewer than 40"
