"""Generate the student files in ``labs/`` from the solutions: the course's single source of truth.

    python -m reference_impl.course.make_labs           # write labs/
    python -m reference_impl.course.make_labs --check   # exit 1 if labs/ is out of date

Two sources, marked as nbgrader marks them:

* **Reference modules.** In ``reference_impl/<module>.py`` a region from
  ``# BEGIN SOLUTION labN: <hint>`` to ``# END SOLUTION`` becomes
  ``raise NotImplementedError("labN: <hint>")`` in ``labs/<module>.py``; the rest of the module
  is copied as it is, so a student edits a working file with holes in it. The hint is short
  (at most :data:`HINT_LIMIT` characters, or this refuses the module): the exercise's name and
  the title of its folded hint in the lab's solved notebook, ``ParallelBlock.__init__ (hint:
  "the TP block" in the notebook)``; the hint's prose lives in that ``<details>`` cell. Its imports of
  the modules with exercises of the same lab point at the student's own files
  (``from reference_impl.tp.tp_collectives import ...`` becomes ``from tp_collectives import
  ...`` in ``labs/tp_layers.py``): within a lab, the student's later exercises run on their
  earlier ones, so a bug shows where it bites; other labs' modules stay the reference, so a
  student stuck on lab 2 can do lab 3.
* **Solved notebooks.** ``solutions/labN_*.ipynb`` becomes ``labs/labN_*.ipynb`` with outputs
  cleared; in code cells a region from ``### BEGIN SOLUTION: <hint>`` to ``### END SOLUTION``
  becomes a ``raise NotImplementedError`` with the hint, in markdown cells a region from
  ``<!-- BEGIN SOLUTION -->`` to ``<!-- END SOLUTION -->`` becomes a prompt for the answer, and
  imports of the modules with exercises of the notebook's lab point at the student's own
  files (``from reference_impl.comm.groups import ...`` becomes ``from groups import ...`` in
  lab 1; lab 5's notebook still imports lab 1's reference). The first code cell starts with
  :data:`STUDENT_PATH_SETUP`, which finds the student's files from any working directory
  (``jupyter nbconvert --execute labs/lab2_tp_layers.ipynb`` from the repository root too) and,
  in a student handout, lets them stand in for the withheld reference modules
  (:mod:`reference_impl.course.own_files`).

Student files are never edited by hand: a test fails when they differ from what this writes.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from reference_impl.course import syllabus
from reference_impl.course.own_files import LABS

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference_impl"
SOLUTIONS = REPO / "solutions"

HINT_LIMIT = 100  # characters of a module marker's hint; its prose goes in the notebook
_MODULE_BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION (?P<lab>lab\d+): (?P<hint>.+)$")
_MODULE_END = re.compile(r"^\s*# END SOLUTION\s*$")
_CELL_BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?::\s*(?P<hint>.*))?$")
_CELL_END = re.compile(r"^\s*### END SOLUTION\s*$")
_ANSWER = re.compile(r"<!-- BEGIN SOLUTION -->.*?<!-- END SOLUTION -->", re.DOTALL)


def replace_regions(source: str, begin: re.Pattern, end: re.Pattern, stub, where: str) -> str:
    """Replace every begin..end region of ``source`` by ``stub(match)`` (a list of lines)."""
    lines, opened = [], None
    for number, line in enumerate(source.splitlines(), start=1):
        if opened is None:
            opened = begin.match(line)
            if opened:
                lines.extend(stub(opened))
                opened_at = number
            else:
                lines.append(line)
        elif begin.match(line):
            raise ValueError(f"{where}:{number}: nested BEGIN SOLUTION (the one at line "
                             f"{opened_at} is still open)")
        elif end.match(line):
            opened = None
    if opened is not None:
        raise ValueError(f"{where}:{opened_at}: BEGIN SOLUTION without END SOLUTION")
    return "\n".join(lines) + ("\n" if source.endswith("\n") else "")


def stubbed_source(path: Path, labs=None) -> str:
    """``path``'s text with the solution regions of ``labs`` (every lab if None) replaced by
    their stubs; the regions of other labs are kept, without their markers."""
    regions = []

    def stub(match):
        message = f"{match['lab']}: {match['hint']}"
        if labs is None or match["lab"] in labs:
            return [f"{match['indent']}raise NotImplementedError({message!r})"]
        regions.append(match)
        return [_KEPT]

    text = path.read_text()
    check_hint_lengths(text, str(path))
    body = replace_regions(text, _MODULE_BEGIN, _MODULE_END, stub, str(path))
    if "SOLUTION" in body:  # a marker not in the form above would leak its solution
        raise ValueError(f"{path}: malformed solution marker; use '# BEGIN SOLUTION labN: hint'")
    if regions:  # put the kept regions back, markers left out
        kept = iter(solution_regions(text))
        body = "\n".join("\n".join(next(kept)[1]) if line == _KEPT else line
                          for line in body.split("\n"))
    return body


def check_hint_lengths(source: str, where: str) -> None:
    """A ValueError for the first module marker of ``source`` whose hint is longer than
    :data:`HINT_LIMIT`: a stub's message names the exercise and its hint in the notebook."""
    for number, line in enumerate(source.splitlines(), start=1):
        opened = _MODULE_BEGIN.match(line)
        if opened and len(opened["hint"]) > HINT_LIMIT:
            raise ValueError(
                f"{where}:{number}: the hint of this solution marker is {len(opened['hint'])} "
                f"characters, over the limit of {HINT_LIMIT}: keep the exercise's name and the "
                "title of its hint (`(hint: \"...\" in the notebook)`), and move the prose into "
                "that folded hint of the lab's solved notebook")


_KEPT = "\0kept solution region\0"  # a placeholder no source line can be


def solution_regions(source: str) -> list[tuple[str, list[str]]]:
    """Every solution region of a reference module's text: (its lab, the lines inside it)."""
    regions, inside = [], None
    for line in source.splitlines():
        opened = _MODULE_BEGIN.match(line)
        if opened:
            inside = (opened["lab"], [])
        elif inside is not None and _MODULE_END.match(line):
            regions.append(inside)
            inside = None
        elif inside is not None:
            inside[1].append(line)
    return regions


def student_module(path: Path, solved: bool = False, labs_by_module=None) -> str:
    """The student version of a reference module; ``solved``: as a student hands it in once
    every exercise is done (the solutions in place of the stubs). ``labs_by_module``:
    :func:`reference_impl.course.syllabus.labs_of_files`, where the caller has it already."""
    its_labs = {lab for lab, _ in solution_regions(path.read_text())}
    same_lab = [name for name, labs in (labs_by_module or syllabus.labs_of_files()).items()
                if name != path.stem and its_labs & set(labs)]
    body = student_imports(stubbed_source(path, labs=set() if solved else None), same_lab)
    source = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    header = (f"# Student file for the labs, generated from {source} by\n"
              "# `python -m reference_impl.course.make_labs`: fill in every\n"
              "# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.\n")
    return header + body


# Where exercises can live.
LIBRARY_PACKAGES = ("comm", "tp", "memory", "pipeline", "hybrid", "perf", "cp", "moe")


def modules_with_exercises() -> list[Path]:
    """The library modules with solution regions; each becomes ``labs/<its name>.py``."""
    return sorted((path for package in LIBRARY_PACKAGES
                   for path in (REFERENCE / package).glob("*.py")
                   if "BEGIN SOLUTION" in path.read_text()), key=lambda path: path.name)


def labs_of_modules() -> dict[str, list[str]]:
    """Module name -> the labs whose exercises it holds, e.g. ``{"tp_layers": ["lab2"]}``."""
    return {path.stem: sorted({lab for lab, _ in solution_regions(path.read_text())})
            for path in modules_with_exercises()}


def student_imports(source: str, module_names: list[str]) -> str:
    """``source`` with its imports of the reference modules ``module_names`` pointed at the
    student's files of the same names."""
    if not module_names:
        return source
    imports = re.compile(r"\breference_impl\.(?:\w+\.)?(" + "|".join(map(re.escape, module_names))
                         + r")\b")
    return imports.sub(r"\1", source)


# The first lines of every student notebook: your files, found from any working directory.
STUDENT_PATH_SETUP = ("from reference_impl.course.own_files import use_my_files\n"
                      "use_my_files()  # your files in labs/ (see its docstring)\n\n")


def student_notebook(path: Path, module_names: list[str], solved: bool = False) -> str:
    """The student version of a solved notebook, as the text of an .ipynb file; ``solved``: as
    a student finishes it (every exercise cell filled in with the solution)."""
    import nbformat  # only here: the graded ranks use this module's lists, not notebooks

    notebook = nbformat.read(path, as_version=4)

    def stub(match):
        hint = match["hint"] or "write this part"
        return [f"{match['indent']}# YOUR CODE HERE",
                f"{match['indent']}raise NotImplementedError({hint!r})"]

    first_code = next((cell for cell in notebook.cells if cell.cell_type == "code"), None)
    for index, cell in enumerate(notebook.cells):
        where = f"{path}: cell {index}"
        if cell.cell_type == "code":
            source = (_without_markers(cell.source) if solved else
                      replace_regions(cell.source, _CELL_BEGIN, _CELL_END, stub, where))
            cell.source = student_imports(source, module_names)
            if cell is first_code:
                cell.source = STUDENT_PATH_SETUP + cell.source
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown" and not solved:
            cell.source = _ANSWER.sub("*Your answer here.*", cell.source)
    return nbformat.writes(notebook) + "\n"


def _without_markers(source: str) -> str:
    return "\n".join(line for line in source.split("\n")
                     if not (_CELL_BEGIN.match(line) or _CELL_END.match(line)))


def student_files(solved: bool = False) -> dict[Path, str]:
    """Every student file in ``labs/`` and the text it must have; ``solved``: as a student
    hands them in, every exercise done (modules and notebooks)."""
    labs_by_module = syllabus.labs_of_files()
    check_markers(labs_by_module)
    files = {LABS / path.name: student_module(path, solved, labs_by_module)
             for path in modules_with_exercises()}
    for lab in syllabus.LABS:
        path = SOLUTIONS / f"{lab.notebook}.ipynb"
        files[LABS / path.name] = student_notebook(path, list(lab.files), solved)
    return files


def check_markers(labs_by_module: dict[str, list[str]]) -> None:
    """The solution markers of the reference modules put each lab's exercises in the files the
    syllabus lists for it, or a ValueError says where they differ."""
    marked = labs_of_modules()
    if marked != labs_by_module:
        differ = sorted(name for name in {*marked, *labs_by_module}
                        if marked.get(name) != labs_by_module.get(name))
        raise ValueError("the solution markers and reference_impl/course/syllabus.py disagree: "
                         + "; ".join(f"{name}: markers {marked.get(name, [])}, syllabus "
                                     f"{labs_by_module.get(name, [])}" for name in differ))


def out_of_date() -> list[Path]:
    """Student files whose committed text differs from what would be generated."""
    return [path for path, text in student_files().items()
            if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only report student files that are out of date (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        stale = out_of_date()
        for path in stale:
            print(f"out of date: {path.relative_to(REPO)}")
        if not stale:
            print(f"{len(student_files())} student files in labs/ are up to date")
        return 1 if stale else 0
    LABS.mkdir(exist_ok=True)
    for path, text in student_files().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
