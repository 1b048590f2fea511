"""Where a student's files stand in for modules: in graded runs and in the student notebooks.

In a student handout the withheld labs' reference modules are stubs, so the student's own file
stands in for each of them, as one module object under both names (``reference_impl.tp.tp_layers``
*is* the student's ``tp_layers``): :func:`stand_in` in every rank and helper of a graded run,
:func:`use_my_files` in a notebook, :func:`run_as_program` for a withheld module run as a program.
Details: docs/teaching.md, 'A term with the kit'.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import runpy
import sys
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1]
LABS = LIBRARY.parent / "labs"
# Written into a student handout (course/handout.py): the reference modules that are stubs there.
WITHHELD_LIST = Path(__file__).resolve().parent / "withheld.txt"


def reference_module_name(name: str) -> str:
    """``"groups"`` -> ``"reference_impl.comm.groups"``: student files are flat, the library is
    in subpackages, and every module name in it is unique."""
    found = sorted(LIBRARY.glob(f"*/{name}.py"))
    if len(found) != 1:
        raise ModuleNotFoundError(f"no single reference module named {name!r} (found {found})")
    return ".".join(("reference_impl", found[0].parent.name, name))


def withheld_modules() -> list[str]:
    """The reference modules that are stubs in this copy of the kit (a student handout)."""
    if not WITHHELD_LIST.exists():
        return []
    return [line.strip() for line in WITHHELD_LIST.read_text().splitlines() if line.strip()]


def stand_in(folder: Path, student_names=None, also_withheld=()) -> None:
    """From now on, in this process: the bare names ``student_names`` (default: the
    withheld modules) are the files of ``folder``, and every withheld reference module (this
    copy's, and ``also_withheld``: those a graded run shows as stubs) is the student's module
    of its name."""
    withheld = {reference_module_name(name): name
                for name in (*withheld_modules(), *also_withheld)}
    names = set(student_names or ()) | set(withheld.values())
    if not names:
        return
    for module_name in (*names, *withheld):
        sys.modules.pop(module_name, None)  # imported already (say, by the rank server)
    sys.meta_path.insert(0, _StudentFiles(Path(folder), names, withheld))


def use_my_files() -> None:
    """The first line of every student notebook: your files in ``labs/`` are found from any
    working directory (Jupyter starts kernels in the notebook's folder, nbconvert in the
    caller's), and in a handout they stand in for the withheld modules, here and in the ranks
    the notebook launches."""
    if str(LABS) not in sys.path:
        sys.path.insert(0, str(LABS))
    if withheld_modules():
        from reference_impl.comm import launcher

        stand_in(LABS)
        launcher.default_rank_setup = functools.partial(stand_in, LABS)


def run_as_program(name: str) -> None:
    """Run the student's ``labs/<name>.py`` as ``__main__`` (its command line is this process's),
    on the student's files wherever it imports a withheld module, as in a notebook."""
    use_my_files()
    runpy.run_path(str(LABS / f"{name}.py"), run_name="__main__")


def require(path: Path, name: str) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the submission needs every student "
                                f"file of labs/ ({name}.py among them)")


class _StudentFiles(importlib.abc.MetaPathFinder):
    """Finds a student module's bare name (``tp_collectives``) in the student's folder, and
    the reference name of a withheld module as that same module object."""

    def __init__(self, folder: Path, names: set[str], withheld: dict[str, str]):
        self.folder, self.names, self.withheld = folder, names, withheld

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
            file = self.folder / f"{fullname}.py"
            require(file, fullname)
            return importlib.util.spec_from_file_location(fullname, file)
        if fullname in self.withheld:
            return importlib.util.spec_from_loader(fullname, _SameModule(self.withheld[fullname]))
        return None


class _SameModule(importlib.abc.Loader):
    """Loads a name as another, already importable, module: ``reference_impl.tp.tp_layers`` as
    the student's ``tp_layers``."""

    def __init__(self, name: str):
        self.name = name

    def create_module(self, spec):
        return importlib.import_module(self.name)

    def exec_module(self, module) -> None:
        pass  # it ran when it was imported under its own name
