"""Running things inside a student handout as its students do, with nothing of this repository
importable: the handout's own ``reference_impl`` only.

The kit is installed here in editable mode, whose import hook would find any module the
handout lacks in this repository. So handout runs use :func:`handout_python`: a virtual
environment of its own that sees this environment's packages (torch, pytest, Jupyter, the
kit's pytest plugin entry point) through a ``.pth`` line but not the editable hook (a folder
named by a ``.pth`` line is not scanned for ``.pth`` files itself), with ``PYTHONPATH`` set to
the handout. Every run first checks that the library it imports is the handout's.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points
from pathlib import Path

from support import nested

from support import REPO
README = (REPO / "README.md").read_text()
# The README's commands, as printed there.
BUILD_COMMAND = re.search(r"^python -m reference_impl\.course\.handout [^\s#]+", README,
                          re.MULTILINE).group(0)
STUDENT_COMMAND = re.search(r"^pytest --impl labs -m lab0$", README, re.MULTILINE).group(0)


def student_command(lab) -> str:
    """The README's student command for ``lab`` (a syllabus lab), as its notebook prints it."""
    return STUDENT_COMMAND.replace("lab0", lab.marker)


def build_handout(where: Path, *options: str) -> Path:
    """The handout the README's command builds (with ``options``), run from ``where``."""
    command = f"{BUILD_COMMAND} {' '.join(options)}".strip()
    # The answer finder takes a minute alone, several on a loaded machine.
    process = subprocess.run(command, shell=True, cwd=where, capture_output=True, text=True,
                             timeout=900, env=with_this_python_first())
    assert process.returncode == 0, f"`{command}` failed:\n{process.stdout}{process.stderr}"
    return where / BUILD_COMMAND.split()[-1]


def with_this_python_first(python: Path | None = None) -> dict[str, str]:
    folder = (python or Path(sys.executable)).parent
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def handout_python(folder: Path) -> Path:
    """A Python in ``folder`` with this environment's packages but not the kit."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True,
                   timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                         "['purelib'])"], capture_output=True, text=True,
                          check=True).stdout.strip()
    Path(site, "kit_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Its own `pytest` command, as pip installs it (pytest's console script): what a student
    # types runs here.
    (script,) = entry_points(group="console_scripts", name="pytest")
    launcher = folder / "bin" / "pytest"
    launcher.write_text(f"#!{python}\nimport sys\nfrom {script.module} import {script.attr}\n"
                        f"sys.exit({script.attr}())\n")
    launcher.chmod(0o755)
    return python


_ONLY_THE_HANDOUT = ("import pathlib, reference_impl; assert pathlib.Path(reference_impl.__file__)"
                     ".is_relative_to(pathlib.Path.cwd()), reference_impl.__file__")


def in_handout(python: Path, handout: Path, command: str | list, timeout: float = nested.LIMIT,
               **variables: str) -> subprocess.CompletedProcess:
    """``command`` from the handout's root on ``python`` (first on PATH, so ``pytest`` is its
    own): a string through the shell, as its student types it, or a list of arguments."""
    environment = with_this_python_first(python)
    environment.pop("PYTEST_ADDOPTS", None)
    environment.update(PYTHONPATH=str(handout), **variables)
    check = subprocess.run([python, "-c", _ONLY_THE_HANDOUT], cwd=handout, env=environment,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, f"the run would not use the handout's library: {check.stderr}"
    return subprocess.run(command, shell=isinstance(command, str), cwd=handout,
                          env=environment, capture_output=True, text=True, timeout=timeout)


NOTEBOOK_RUN = """
import sys
from pathlib import Path

import nbformat
from reference_impl.course.kernel import notebook_client

path = Path(sys.argv[1]).resolve()
notebook = nbformat.read(path, as_version=4)
notebook_client(notebook, cwd=path.parent).execute()
"""


def run_notebook(python: Path, handout: Path, notebook: Path) -> subprocess.CompletedProcess:
    """Execute ``notebook`` top to bottom in the handout, on a kernel of ``python``, in the
    notebook's folder (as Jupyter does); a failing cell fails the process, naming it."""
    return in_handout(python, handout, [str(python), "-c", NOTEBOOK_RUN, str(notebook)])
