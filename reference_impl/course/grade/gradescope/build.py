"""The autograder's zip, built from the kit's files as they are now (nothing in it is a copy
kept by hand): ``setup.sh`` and ``run_autograder`` from this folder, ``autograder.json`` (the
labs, the points, the container they need), and ``kit/``: the students' handout at the graded
labs (they and every later lab withheld: :mod:`reference_impl.course.handout`) with the graded
labs' hidden checks added."""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from reference_impl.course import handout, syllabus
from reference_impl.course.grade.gradescope import containers
from reference_impl.course.grade.points import Points

HERE = Path(__file__).resolve().parent
HIDDEN_CHECKS = handout.REPO / handout.HIDDEN_TESTS
CONFIG = "autograder.json"
POINTS = "points.json"
TORCH_BUILDS = ("cpu", "cuda")
_EXECUTABLE = 0o100755 << 16  # a zip entry's mode: a regular file, rwxr-xr-x
_FILE = 0o100644 << 16


def torch_requirement() -> str:
    """The kit's own requirement on PyTorch, from its ``pyproject.toml``."""
    found = re.search(r'^\s*"(torch[^"]*)",?\s*$', (handout.REPO / "pyproject.toml").read_text(),
                      re.MULTILINE)
    return found.group(1)


def commit() -> str:
    """The kit's commit the zip is built from (and whether files differed from it)."""
    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=handout.REPO, capture_output=True,
                              text=True).stdout.strip()
    return (git("rev-parse", "--short", "HEAD") or "unknown") + (
        " (with changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def config(labs: list[str], torch_build: str, points: Path | None) -> dict:
    return {"labs": labs, "torch": torch_build, "points": POINTS if points else None,
            "built_from": commit(), **containers.settings(labs)}


def readme(settings: dict) -> str:
    """What the instructor sets on Gradescope, from the measured costs."""
    box = settings["container"]
    lines = [f"Autograder for {', '.join(settings['labs'])} (built from the kit at "
             f"{settings['built_from']}; PyTorch: {settings['torch']} build).", "",
             f"Gradescope container: at least {box['cpus']:g} CPU and {box['memory']} "
             f"(a submission takes {box['seconds_at_least']} s or more there).", "",
             "lab   CPUs  memory   s at least   measured: wall s, CPU s, peak GiB"]
    for lab, cost in settings["per_lab"].items():
        lines.append(f"{lab:5} {cost['cpus']:5g}  {cost['memory']:8} {cost['seconds_at_least']:10}"
                     f"   {cost['wall_s']}, {cost['cpu_s']}, {cost['peak_gib']}")
    lines += ["", f"Measured on {settings['measured_on']}.", ""]
    return "\n".join(lines)


def build(labs: list[str], out: Path, torch_build: str = "cpu", points: Path | None = None) -> dict:
    """Write the autograder for ``labs`` (markers, e.g. ``["lab2"]``) to ``out``; return its
    ``autograder.json``."""
    if points is not None:
        Points.load(str(points))  # refused here, with its reason, rather than in the container
    settings = config(labs, torch_build, points)
    first = min(int(lab.removeprefix("lab")) for lab in labs)
    with tempfile.TemporaryDirectory(prefix="autograder-") as folder:
        kit = Path(folder) / "kit"
        handout.build(kit, first)
        hidden = kit / handout.HIDDEN_TESTS
        hidden.mkdir()
        for name in ["conftest.py", *(f"test_{lab}_hidden.py" for lab in labs)]:
            shutil.copy2(HIDDEN_CHECKS / name, hidden / name)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            setup = (HERE / "setup.sh").read_text().replace("@TORCH_BUILD@", torch_build) \
                .replace("@TORCH@", torch_requirement())
            _add(archive, "setup.sh", setup, _EXECUTABLE)
            _add(archive, "run_autograder", (HERE / "run_autograder").read_text(), _EXECUTABLE)
            _add(archive, CONFIG, json.dumps(settings, indent=2) + "\n", _FILE)
            _add(archive, "README.txt", readme(settings), _FILE)
            if points is not None:
                _add(archive, POINTS, points.read_text(), _FILE)
            for path in sorted(kit.rglob("*")):
                if path.is_file():
                    _add(archive, f"kit/{path.relative_to(kit).as_posix()}", path.read_bytes(),
                         _EXECUTABLE if path.stat().st_mode & 0o100 else _FILE)
    return settings


def _add(archive: zipfile.ZipFile, name: str, data, mode: int) -> None:
    entry = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # the same zip each build
    entry.external_attr = mode
    entry.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(entry, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.course.grade.gradescope",
                                     description="Build Gradescope's autograder for some labs")
    parser.add_argument("--labs", required=True, help="the labs the assignment grades, e.g. 2 or 2,3")
    parser.add_argument("--out", type=Path, required=True, help="the zip to write")
    parser.add_argument("--torch", choices=TORCH_BUILDS, default="cpu",
                        help="the PyTorch build setup.sh installs (default cpu: Gradescope's "
                             "containers have no GPU)")
    parser.add_argument("--points", type=Path, default=None,
                        help="points per test or per lab (JSON: docs/grading.md)")
    args = parser.parse_args(argv)
    try:
        settings = build(syllabus.parse_labs(args.labs), args.out, args.torch, args.points)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    print(f"wrote {args.out}: upload it as the assignment's autograder\n")
    print(readme(settings))
    return 0
