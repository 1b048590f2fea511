"""Find an exercise's answer in the files a handout ships: the build refuses to finish on one.

A solution line is a line inside a solution region (``# BEGIN SOLUTION labN`` in a reference
module, ``### BEGIN SOLUTION`` in a solved notebook's code cell, ``<!-- BEGIN SOLUTION -->`` in
its prose) with at least :data:`LONG` non-space characters: short lines (``return out``) are
shared by any code, long ones are the answer. Whitespace is ignored when comparing, so a line
re-indented or re-wrapped into a test, a library module or a notebook is still found.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from reference_impl.course import syllabus
from reference_impl.course.make_labs import (SOLUTIONS, _CELL_BEGIN, _CELL_END,
                                             modules_with_exercises, solution_regions)

LONG = 30  # non-space characters from which a solution line counts as an answer
_ANSWER = re.compile(r"<!-- BEGIN SOLUTION -->(.*?)<!-- END SOLUTION -->", re.DOTALL)
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Leak:
    file: str  # the shipped file, relative to the handout
    lab: str  # the lab whose answer it holds
    line: str  # the solution line, as the solution writes it

    def __str__(self) -> str:
        return f"{self.file} holds {self.lab}'s solution line {self.line.strip()!r}"


def squeezed(text: str) -> str:
    return _SPACE.sub("", text)


def _cells(path: Path, kind: str) -> list[str]:
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]
            if cell["cell_type"] == kind]


def _notebook_code_regions(path: Path) -> list[str]:
    lines, inside = [], False
    for source in _cells(path, "code"):
        for line in source.splitlines():
            if _CELL_BEGIN.match(line):
                inside = True
            elif _CELL_END.match(line):
                inside = False
            elif inside:
                lines.append(line)
    return lines


def _notebook_regions(path: Path) -> list[str]:
    """The solution lines of a solved notebook: its code regions and its prose answers."""
    answers = [line for source in _cells(path, "markdown")
               for answer in _ANSWER.findall(source) for line in answer.splitlines()]
    return _notebook_code_regions(path) + answers


def solution_lines(labs: set[str]) -> dict[str, tuple[str, str]]:
    """Squeezed solution line -> (its lab, the line) for the exercises of ``labs``."""
    found: dict[str, tuple[str, str]] = {}
    for path in modules_with_exercises():
        for lab, lines in solution_regions(path.read_text()):
            if lab in labs:
                found.update({squeezed(line): (lab, line) for line in lines})
    for lab in syllabus.LABS:
        if lab.marker in labs:
            for line in _notebook_regions(SOLUTIONS / f"{lab.notebook}.ipynb"):
                found[squeezed(line)] = (lab.marker, line)
    return {key: value for key, value in found.items()
            if len(key) >= LONG and not key.startswith("#")}


def leaks(root: Path, names: list[str], labs: set[str]) -> list[Leak]:
    """The solution lines of ``labs`` found in the files ``names`` under ``root``."""
    answers = solution_lines(labs)
    found = []
    for name in names:
        try:
            text = (root / name).read_text()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        if name.endswith(".ipynb"):
            text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        flat = squeezed(text)
        found += [Leak(name, lab, line) for key, (lab, line) in answers.items() if key in flat]
    return found


def written_lines(lab: str) -> int:
    """The lines a student writes for ``lab``: non-blank, non-comment lines of its solution
    regions, in the reference modules and in its solved notebook's code cells."""
    def counted(line: str) -> bool:
        return bool(line.strip()) and not line.strip().startswith("#")

    modules = sum(counted(line) for path in modules_with_exercises()
                  for region_lab, lines in solution_regions(path.read_text())
                  if region_lab == lab for line in lines)
    notebook = SOLUTIONS / f"{syllabus.lab(lab).notebook}.ipynb"
    cells = sum(counted(line) for line in _notebook_code_regions(notebook))
    return modules + cells
