"""Build the repository students clone: the kit with the solutions of the withheld labs out.

    python -m reference_impl.course.handout OUT                         # start of term: every lab withheld
    python -m reference_impl.course.handout OUT --withhold-from lab3    # labs 0-2 released

As nbgrader's ``generate_assignment`` does, from the same solution markers as ``make_labs``
(one source of truth): in every reference module, the solution regions of the withheld labs
(``labN`` and later) become their stubs, ``raise NotImplementedError("labN: <hint>")``, so the
library still imports and every signature and contract message is there; the solved notebooks
and the instructor decks of the withheld labs are left out. The handout keeps the student
notebooks and files (``labs/``), the graded tests (``tests/labs/``), the infrastructure
they run on (launcher, checks, the single-device model, the pytest plugin), and gets a README
for students. ``reference_impl/course/withheld.txt`` lists the stubbed modules: in a graded
run there, an import of one of them gets the student's own file (``labs/tp_layers.py`` for
``reference_impl.tp.tp_layers``), so a lab that builds on a withheld one uses the student's
work. Earlier labs' solutions are released as the reference.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from reference_impl.course.own_files import WITHHELD_LIST
from reference_impl.course import syllabus
from reference_impl.course.make_labs import modules_with_exercises, stubbed_source

REPO = Path(__file__).resolve().parents[2]
_LAB_FILE = re.compile(r"^(?:solutions|slides)/lab(\d+)_.*\.ipynb$")
# Sections of the kit's README a student needs, in this order.
STUDENT_SECTIONS = ("Course map", "Set up and test", "For students")


def tracked_files() -> list[str]:
    """The kit's files: what git tracks (as they are in the working tree)."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    return [name for name in listed if (REPO / name).is_file()]


def left_out(name: str, first_withheld: int) -> bool:
    """Whether a file of the kit stays out of the handout."""
    lab_file = _LAB_FILE.match(name)
    if lab_file:
        return int(lab_file.group(1)) >= first_withheld  # solved notebooks and decks
    if name.startswith("tests/"):
        return not name.startswith("tests/labs/")  # the graded tests only
    return name == "README.md" or name == str(WITHHELD_LIST.relative_to(REPO))


def withheld_labs(first_withheld: int) -> set[str]:
    return {lab.marker for lab in syllabus.LABS if lab.number >= first_withheld}


def student_readme(first_withheld: int) -> str:
    """The student README: the kit's title, its course map, set-up and student sections."""
    text = (REPO / "README.md").read_text()
    title = text.splitlines()[0]
    sections = re.split(r"(?m)^(?=## )", text)
    kept = [section for name in STUDENT_SECTIONS for section in sections
            if section.startswith(f"## {name}\n")]
    released = ("none: every lab is yours to write" if first_withheld == 0 else
                f"labs 0 to {first_withheld - 1} (their solutions are in `reference_impl/`)")
    intro = (f"{title}\n\nYour copy of the course. Released labs: {released}. For a withheld "
             "lab, the library's module holds the same stubs as your file in `labs/`, and "
             "when you run the checks, your file stands in for it wherever the library or a "
             "later lab imports it.\n\n")
    return intro + "".join(kept).rstrip() + "\n"


def build(out: Path, first_withheld: int) -> list[str]:
    """Write the handout to ``out`` (which must not exist); return the stubbed module names."""
    if out.exists():
        raise FileExistsError(f"{out} exists: the handout is written to a new folder")
    labs = withheld_labs(first_withheld)
    labs_of_files = syllabus.labs_of_files()
    stubbed = {path.relative_to(REPO).as_posix(): path for path in modules_with_exercises()
               if set(labs_of_files[path.stem]) & labs}
    for name in tracked_files():
        if left_out(name, first_withheld):
            continue
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name in stubbed:
            target.write_text(stubbed_source(stubbed[name], labs))
        else:
            shutil.copy2(REPO / name, target)
    names = sorted(path.stem for path in stubbed.values())
    (out / WITHHELD_LIST.relative_to(REPO)).write_text("".join(f"{n}\n" for n in names))
    (out / "README.md").write_text(student_readme(first_withheld))
    # Only the graded tests, from the handout's root (pytest.ini outranks pyproject.toml).
    (out / "pytest.ini").write_text("[pytest]\ntestpaths = tests/labs\n")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to create")
    parser.add_argument("--withhold-from", default="lab0",
                        help="the first withheld lab: it and every later one (default lab0: "
                             "all of them)")
    args = parser.parse_args(argv)
    match = re.fullmatch(r"(?:lab)?(\d+)", args.withhold_from)
    if not match:
        parser.error(f"--withhold-from {args.withhold_from}: give a lab, e.g. lab3")
    try:
        names = build(args.out, int(match.group(1)))
    except FileExistsError as error:
        parser.error(str(error))
    print(f"wrote the handout to {args.out}; stubbed: {', '.join(names) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
