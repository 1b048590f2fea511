"""What the code of a submission sees of the kit while it is graded: the students' view.

Inside the sandbox of a graded run the kit reads as a student's copy of it reads while the
graded labs are withheld, they and every later lab: each module holding their exercises is its
stub (the submission's own file is the only solution in reach), the solved notebooks and decks of
those labs and the library files that draw their answers are empty, their compiled bytecode is empty,
and the folders a handout leaves out (the kit's history, the hidden checks, the kit's own tests)
are empty. What the hidden checks run in a rank reaches it by value (cloudpickle), never by
importing their module. What each part covers: docs/grading.md, 'What a submission can see'.
"""
from __future__ import annotations

import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cloudpickle

from reference_impl.course import handout, make_labs

REPO = handout.REPO
HIDDEN_CHECKS = REPO / handout.HIDDEN_TESTS
# Folders no rank of a graded run needs, each holding what a handout leaves out.
OUT_OF_VIEW = (".git", "tests/course", "tests/library", "tests/support", handout.HIDDEN_TESTS)
_LAB_NUMBER = re.compile(r"^lab(\d+)$")


def hidden_folders() -> tuple[str, ...]:
    """The folders a graded rank finds empty: the kit's, and the compiled bytecode's where
    Python keeps it apart (``PYTHONPYCACHEPREFIX``)."""
    kept_apart = (sys.pycache_prefix,) if sys.pycache_prefix else ()
    return tuple(str(REPO / name) for name in OUT_OF_VIEW if (REPO / name).is_dir()) + kept_apart


def exercise_modules(labs) -> list[Path]:
    """The reference modules holding exercises of ``labs``."""
    labs_of = make_labs.labs_of_modules()
    return [path for path in make_labs.modules_with_exercises()
            if set(labs) & set(labs_of[path.stem])]


def replaced_files(labs, folder: Path) -> tuple[tuple[str, str], ...]:
    """(file of the kit, the file read there instead) for the graded ``labs`` (markers such as
    ``"lab0"``): each module with their exercises and its stub, written into ``folder``; their
    solved notebooks and decks, the figures drawing their answers, and every module's compiled
    bytecode (which Python then ignores), with an empty file."""
    labs = set(labs)
    numbers = {int(_LAB_NUMBER.match(lab).group(1)) for lab in labs}
    folder.mkdir(parents=True, exist_ok=True)
    empty = folder / "empty"
    empty.touch()
    replaced = []
    for path in exercise_modules(labs):
        stub = folder / path.name
        stub.write_text(make_labs.stubbed_source(path, labs))
        replaced.append((str(path), str(stub)))
        replaced += [(str(compiled), str(empty))
                     for compiled in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc")]
    for path in sorted(REPO.glob("*/lab*.ipynb")):
        if handout.lab_file_number(path.relative_to(REPO).as_posix()) in numbers:
            replaced.append((str(path), str(empty)))
    replaced += [(str(REPO / name), str(empty)) for name, number in handout.WITH_ITS_LAB.items()
                 if number in numbers and (REPO / name).is_file()]
    return tuple(replaced)


@dataclass(frozen=True)
class StudentsView:
    """The sandbox's parts that make the view, and the folder holding its stubs."""
    hidden: tuple[str, ...]
    replaced: tuple[tuple[str, str], ...]
    stubbed: tuple[str, ...]  # the modules shown as stubs: the submission's own stand in
    folder: Path

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def students_view(labs) -> StudentsView:
    """The view of a run grading ``labs``: as at that point of the term, the first of them
    and every later lab withheld (a later lab's solution is no more the student's to read
    than a graded one's, and no graded check uses it). From now on the hidden checks'
    functions travel to the ranks by value (their folder is empty there)."""
    for module in list(sys.modules.values()):
        if Path(getattr(module, "__file__", None) or "/").is_relative_to(HIDDEN_CHECKS):
            cloudpickle.register_pickle_by_value(module)
    withheld = handout.withheld_labs(min(int(_LAB_NUMBER.match(lab).group(1)) for lab in labs))
    folder = Path(tempfile.mkdtemp(prefix="students-view-"))
    return StudentsView(hidden_folders(), replaced_files(withheld, folder),
                        tuple(path.stem for path in exercise_modules(withheld)), folder)
