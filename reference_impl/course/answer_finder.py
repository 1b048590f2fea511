"""Find an exercise's answer in a handout by what it does, not how it is written.

Every function that a handout's Python files and notebooks define is called on each unit's
inputs (:mod:`reference_impl.course.answer_units`) in place of the student's, whatever its
names; one that gives the reference's results on every input is an answer written another way.
Every literal the files assign (a table, a list of orders) is compared with the results and
their texts, for the units whose results are tables. The functions run in a process of their
own (:mod:`reference_impl.course.answer_trial`), with the handout's files first on its path
(so the withheld modules are the stubs), on a copy of the handout (a function may write beside
its file), bounded in time and killed with its children.

:data:`KNOWN` lists the answers a handout still ships, each with why: the build refuses any
other, and refuses a known one that is gone until it leaves the list.
"""
from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from reference_impl.course.answer_trial import plain
from reference_impl.course.answer_units import units

TRIAL = Path(__file__).resolve().parent / "answer_trial.py"
TIMEOUT_S = 600
MEMORY_BYTES = 6 << 30  # the trial's address space
_RUN = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
# (unit, where) -> why it still ships.
KNOWN: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Answer:
    unit: str
    where: str  # file:function, or file:line of a literal

    def __str__(self) -> str:
        return f"{self.where} gives {self.unit}'s results"


def shipped_files(root: Path, names: list[str]) -> list[tuple[str, str]]:
    """(name, kind) of the Python files and notebooks among ``names``: "notebook", "package"
    (under reference_impl/, imported by its dotted name) or "script" (by its file's stem)."""
    files = []
    for name in names:
        if name.endswith(".ipynb"):
            files.append((name, "notebook"))
        elif name.endswith(".py") and not name.endswith(("__main__.py", "conftest.py", "setup.py")):
            package = name.startswith("reference_impl/") and not name.endswith("__init__.py")
            script = Path(name).parent.as_posix() in ("labs", "tests/labs")  # on the path
            if package or script:
                files.append((name, "package" if package else "script"))
    return files


def job(root: Path, names: list[str], labs: set[str]) -> dict:
    tried = [unit for unit in units() if unit.lab in labs]
    entries = []
    for unit in tried:
        results = [unit.reference(*args) for args in unit.draws]
        texts = [text for result in results if unit.renderings
                 for text in unit.renderings(result) if len(text) >= 24]
        entries.append({"unit": unit.name, "draws": unit.draws, "tables": unit.tables,
                        "expected": [plain(result) for result in results], "texts": texts})
    return {"roots": [str(root), str(root / "labs"), str(root / "tests" / "labs")],
            "files": shipped_files(root, names), "units": entries,
            "hidden": [list(pair) for unit in tried for pair in unit.recorded]}


def answers(root: Path, names: list[str], labs: set[str]) -> list[Answer]:
    """The functions and literals among the files ``names`` under ``root`` that give the
    results of an exercise of ``labs``."""
    with tempfile.TemporaryDirectory(prefix="answer-finder-") as scratch:
        scratch = Path(scratch)
        # A copy: a function tried may write next to its own file (a figure, a deck).
        root = shutil.copytree(root, scratch / "handout", symlinks=True)
        (scratch / "job.pkl").write_bytes(pickle.dumps(job(root, names, labs)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "labs")]),
               "MPLBACKEND": "Agg"}
        process = subprocess.Popen([sys.executable, "-c", _RUN, str(TRIAL), str(scratch / "job.pkl"),
                                    str(scratch / "found.json")], cwd=scratch, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   start_new_session=True, preexec_fn=_bounded)
        try:
            _, error = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            error = f"took more than {TIMEOUT_S} s".encode()
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # and whatever a candidate started
            except ProcessLookupError:
                pass
            process.wait()
        if not (scratch / "found.json").exists():
            raise RuntimeError("the answer finder's trial did not finish: "
                               + error.decode(errors="replace")[-2000:])
        return [Answer(unit, where) for unit, where in json.loads((scratch / "found.json").read_text())]


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def refused(found: list[Answer], labs: set[str]) -> tuple[list[Answer], list[tuple[str, str]]]:
    """The answers not in :data:`KNOWN`, and the known ones of ``labs`` (the labs searched) no
    longer found."""
    lab_of = {unit.name: unit.lab for unit in units()}
    keys = {(answer.unit, answer.where) for answer in found}
    return ([answer for answer in found if (answer.unit, answer.where) not in KNOWN],
            sorted(known for known in set(KNOWN) - keys if lab_of[known[0]] in labs))
