"""Which implementation the graded tests check, and where a submission's code may run.

``--impl reference`` (default) checks ``reference_impl.<module>``; ``--impl labs`` the student
files in ``labs/``; ``--impl PATH`` a submitted copy of ``labs/`` at PATH. A submission's code
runs only in the ranks and helpers the fixtures ``run_on_ranks`` and ``run_alone`` start, never in
pytest's process, where the verdict is reached from the data they return. The fixtures and the
rules a graded test keeps: docs/grading.md, 'Writing a graded test'.
"""
from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

from reference_impl.course import syllabus
from reference_impl.course.own_files import (LABS, LIBRARY, reference_module_name, require,
                                             stand_in)

_submission_may_run_here = False  # set in the ranks and helpers of a graded run (enter())


class SubmissionOutsideItsProcess(RuntimeError):
    """A graded test asked for the implementation's module in pytest's own process."""


@dataclass(frozen=True)
class Implementation:
    source: str  # "reference", or the absolute path of a folder of student modules
    student_names: tuple[str, ...] = ()  # the student files' module names (a folder's)
    stood_in: tuple[str, ...] = ()  # modules whose reference the student's file stands in for

    @classmethod
    def from_option(cls, value: str) -> "Implementation":
        if value == "reference":
            return cls("reference")
        folder = Path(value).expanduser().resolve()
        if value == "labs" and not folder.is_dir():
            folder = LABS  # the kit's own student files, from anywhere
        if not folder.is_dir():
            raise ValueError(f"--impl {value}: {folder} is not a folder")
        return cls(str(folder), tuple(syllabus.student_files()))

    @property
    def name(self) -> str:
        return self.source

    @property
    def folder(self) -> Path | None:
        return None if self.source == "reference" else Path(self.source)

    def enter(self) -> None:
        """Run first in every rank and helper of a graded run: the submission may run here.
        A submission's files import each other by their bare names, as in ``labs/`` (within a
        lab, a student's later exercises use their earlier ones: ``tp_layers.py`` imports
        ``tp_collectives``); where this kit withholds a reference module (a handout) or the
        graded run shows it as a stub (``stood_in``), imports of it get the submission's own
        file too."""
        global _submission_may_run_here
        _submission_may_run_here = True
        if self.folder is not None:
            stand_in(self.folder, self.student_names, self.stood_in)

    def module(self, name: str):
        """The module ``name`` (e.g. ``"collectives"``) of this implementation."""
        if not _submission_may_run_here:
            raise SubmissionOutsideItsProcess(
                f"impl.module({name!r}) in pytest's own process: a graded test loads the "
                "implementation only inside a function it gives to run_on_ranks or run_alone "
                "(see reference_impl.course.grading)")
        if self.folder is None:
            return importlib.import_module(reference_module_name(name))
        require(self.folder / f"{name}.py", name)
        return importlib.import_module(name)  # the submission's file: enter() made it so


# ------------------------------------------------------------ a submission that re-exports

def reference_imports(folder: Path, names) -> list[str]:
    """Where a student file ``<name>.py`` in ``folder`` imports the reference implementation
    of that same module, the part it must write: ``import reference_impl.tp.tp_layers``,
    ``from reference_impl.tp.tp_layers import ...``, or names or ``*`` from a package that
    re-exports it (``from reference_impl.tp import ParallelMLP``). One line per finding."""
    findings = []
    for name in names:
        path = folder / f"{name}.py"
        if not path.exists():
            continue
        target = reference_module_name(name)
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue  # the tests report it
        for node in ast.walk(tree):
            if target in modules_imported(node) or target in _imported_by_name(node):
                findings.append(f"{path.name} line {node.lineno} imports {target}, the "
                                f"reference implementation of the module it must write")
    return findings


def _imported_by_name(node) -> list[str]:
    """``importlib.import_module("...")`` or ``__import__("...")`` with a literal name."""
    if not isinstance(node, ast.Call) or not node.args:
        return []
    function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
        node.func, "id", "")
    name = node.args[0]
    if function in ("import_module", "__import__") and isinstance(name, ast.Constant) \
            and isinstance(name.value, str):
        return [name.value]
    return []


def modules_imported(node) -> list[str]:
    """The reference modules an import statement reaches, re-exports through packages
    included."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
        return []
    found = [node.module]
    for alias in node.names:
        found.append(f"{node.module}.{alias.name}")  # `from reference_impl.tp import tp_layers`
        found.extend(_defining_modules(node.module, alias.name))
    return found


def _defining_modules(package: str, name: str) -> list[str]:
    """The modules a reference package's ``__init__`` takes ``name`` from (all for ``*``)."""
    parts = package.split(".")
    if parts[0] != "reference_impl":
        return []
    init = LIBRARY.joinpath(*parts[1:], "__init__.py")
    if not init.exists():
        return []
    modules = []
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            if name == "*" or any(alias.name == name for alias in node.names):
                modules.append(node.module)
    return modules
