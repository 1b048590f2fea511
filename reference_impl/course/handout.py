"""Build the repository students clone: the kit with the solutions of the withheld labs out.

    python -m reference_impl.course.handout OUT                         # start of term: every lab withheld
    python -m reference_impl.course.handout OUT --withhold-from lab3    # labs 0-2 released

As nbgrader's ``generate_assignment`` does, from ``make_labs``' solution markers: the withheld
labs' solutions become their stubs, the student files, graded tests and library pages ship, and
the build fails on a broken link or a leaked answer: a solution line (``answer_leaks``), or a
function or table that gives an exercise's results (``answer_finder``). What ships and how a
student's file stands in for a withheld module: docs/teaching.md, 'A term with the kit'.
"""
from __future__ import annotations

import argparse
import posixpath
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path

from reference_impl.course.own_files import WITHHELD_LIST
from reference_impl.course import answer_finder, answer_leaks, syllabus
from reference_impl.course.make_labs import modules_with_exercises, stubbed_source

REPO = Path(__file__).resolve().parents[2]
_LAB_FILE = re.compile(r"^(?:solutions|slides)/lab(\d+)_.*\.ipynb$")
# The kit's pages for instructors and maintainers, and its continuous integration.
INSTRUCTOR_ONLY = ("docs/teaching.md", "docs/grading.md", "docs/maintaining.md", ".ci/",
                   "reference_impl/course/snapshots/lab")  # the snapshots' makers
# Library files that draw an exercise's answer (a figure replaying its index arithmetic): they
# ship when their lab's solutions do.
WITH_ITS_LAB = {"reference_impl/figures/ring_all_reduce.py": 0}
# The hidden checks: the batch grader runs them, students never see them.
HIDDEN_TESTS = "tests/labs/hidden/"
# Written by the build rather than copied.
WRITTEN = ("README.md", "pytest.ini", WITHHELD_LIST.relative_to(REPO).as_posix())
STUDENT_README = Path(__file__).resolve().parent / "student_readme.md"
# The pytest configuration of the handout, its only one: the graded tests, on the student's files.
PYTEST_INI = """[pytest]
# Your checks: the graded tests, on your files in labs/ (--impl reference: on the library).
testpaths = tests/labs
impl = labs
"""
# The section of slides/README.md about the kit's own checks of the decks.
SLIDES_KIT_SECTION = "Checks"
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_CODE = re.compile(r"(^```.*?^```|`[^`\n]*`)", re.MULTILINE | re.DOTALL)  # kept apart
_MAIN = re.compile(r'^if __name__ == "__main__":\n.*\Z', re.MULTILINE | re.DOTALL)


def tracked_files() -> list[str]:
    """The kit's files: what git tracks (as they are in the working tree)."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    return [name for name in listed if (REPO / name).is_file()]


def lab_file_number(name: str) -> int | None:
    """The lab of a solved notebook or a deck (``solutions/lab3_...ipynb`` -> 3), else None."""
    lab_file = _LAB_FILE.match(name)
    return int(lab_file.group(1)) if lab_file else None


def left_out(name: str, first_withheld: int) -> bool:
    """Whether a file of the kit stays out of the handout."""
    if lab_file_number(name) is not None:
        return lab_file_number(name) >= first_withheld  # solved notebooks and decks
    if name.startswith("slides/"):
        return first_withheld == 0  # the decks' folder ships with a deck
    if name.startswith("tests/"):
        return not name.startswith("tests/labs/") or name.startswith(HIDDEN_TESTS)
    if name in WITH_ITS_LAB:
        return WITH_ITS_LAB[name] >= first_withheld
    return name.startswith(INSTRUCTOR_ONLY) or name in WRITTEN


def withheld_labs(first_withheld: int) -> set[str]:
    return {lab.marker for lab in syllabus.LABS if lab.number >= first_withheld}


# ------------------------------------------------------------ the student README

def readme_section(text: str, name: str) -> str:
    """The body of the README section ``## name``."""
    for section in re.split(r"(?m)^(?=## )", text):
        if section.startswith(f"## {name}\n"):
            return section.split("\n", 1)[1].strip()
    raise ValueError(f"the kit's README has no section {name!r}")


def as_the_handout_runs(text: str) -> str:
    """The kit README's commands as the handout's ``pytest.ini`` makes them: there, a plain
    ``pytest`` checks the student's files (``impl = labs``)."""
    return text.replace("pytest --impl labs ", "pytest ")


def released_sentence(first_withheld: int) -> str:
    if first_withheld == 0:
        return "No lab is released yet: a lab's solutions come out after its deadline."
    if first_withheld >= len(syllabus.LABS):
        return "Every lab is released: the solutions are in `reference_impl/` and `solutions/`."
    labs = "Lab 0 is" if first_withheld == 1 else f"Labs 0 to {first_withheld - 1} are"
    return (f"{labs} released: their solutions are in `reference_impl/` and `solutions/`; "
            "a later lab's come out after its deadline.")


def labs_table(first_withheld: int) -> str:
    """Each lab: its notebook, the files it has you write, its time, the earlier labs it builds
    on, when its solutions come."""
    rows = ["| lab | topic | notebook | you write | time | builds on | solutions |",
            "|---|---|---|---|---|---|---|"]
    for lab in syllabus.LABS:
        files = ", ".join(f"`{name}.py`" for name in lab.files)
        solutions = ("released" if lab.number < first_withheld else "after its deadline")
        rows.append(f"| {lab.number} | {lab.topic} | `labs/{lab.notebook}.ipynb` | {files} | "
                    f"{lab.minutes} min | {lab.earlier_labs} | {solutions} |")
    return "\n".join(rows)


def student_readme(first_withheld: int) -> str:
    """The handout's README: ``student_readme.md`` filled in with the kit README's title, its
    set-up and student sections, and the labs' table."""
    kit = (REPO / "README.md").read_text()
    return string.Template(STUDENT_README.read_text()).substitute(
        title=kit.splitlines()[0], released=released_sentence(first_withheld),
        set_up=readme_section(kit, "Set up"),
        for_students=as_the_handout_runs(readme_section(kit, "For students")),
        labs=labs_table(first_withheld))


# ------------------------------------------------------------ files as the handout has them

def without_table(toml: str, name: str) -> str:
    """``toml`` without its table ``[name]``: the header and its lines, up to the comment that
    opens the next table."""
    lines = toml.splitlines(keepends=True)
    start = lines.index(f"[{name}]\n")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    while lines[end - 1].startswith("#"):
        end -= 1
    return "".join(lines[:start] + lines[end:])


def runs_student_file(source: str, name: str) -> str:
    """A withheld module's ``if __name__ == "__main__":`` block: the student's file runs."""
    block = (f'if __name__ == "__main__":  # withheld in this handout: your labs/{name}.py runs\n'
             "    from reference_impl.course.own_files import run_as_program\n\n"
             f'    run_as_program("{name}")\n')
    return _MAIN.sub(lambda _: block, source)


def shipped_link(name: str, target: str, shipped: set[str]) -> bool | None:
    """Whether a link of page ``name`` reaches a shipped file or folder (None: the link is not
    to a file of the repository: a URL or an anchor)."""
    if re.match(r"^(?:[a-z]+:|#)", target):
        return None
    path = posixpath.normpath(posixpath.join(posixpath.dirname(name), target.split("#")[0]))
    return path in shipped or any(other.startswith(path + "/") for other in shipped)


def unlinked(page: str, name: str, shipped: set[str]) -> str:
    """A kit page as it ships: its links to files that do not ship become their text."""
    def link(match):
        return match.group(0) if shipped_link(name, match.group(2), shipped) is not False \
            else match.group(1)
    pieces = _CODE.split(page)  # prose, code, prose, ...
    return "".join(_LINK.sub(link, piece) if i % 2 == 0 else piece
                   for i, piece in enumerate(pieces))


def shipped_decks_only(page: str, shipped: set[str]) -> str:
    """slides/README.md with the rows of the decks that ship, without its section on the kit's
    checks of the decks."""
    rows = [line for line in page.splitlines(keepends=True)
            if not (deck := re.match(r"^\| `(lab\d+_\w+\.ipynb)` \|", line))
            or f"slides/{deck.group(1)}" in shipped]
    sections = re.split(r"(?m)^(?=## )", "".join(rows))
    return "".join(section for section in sections
                   if not section.startswith(f"## {SLIDES_KIT_SECTION}\n"))


def shipped_text(name: str, shipped: set[str]) -> str | None:
    """A kit file's text as the handout has it, where it differs (None: copied as it is)."""
    if name == "pyproject.toml":
        return without_table((REPO / name).read_text(), "tool.pytest.ini_options")
    if not name.endswith(".md"):
        return None
    page = (REPO / name).read_text()
    if name == "slides/README.md":
        page = shipped_decks_only(page, shipped)
    return unlinked(page, name, shipped)


def broken_links(out: Path) -> list[str]:
    """Every relative link of the handout's Markdown that reaches no file of it."""
    shipped = {path.relative_to(out).as_posix() for path in out.rglob("*") if path.is_file()}
    broken = []
    for page in sorted(out.rglob("*.md")):
        name = page.relative_to(out).as_posix()
        for _, target in _LINK.findall("".join(_CODE.split(page.read_text())[::2])):
            if shipped_link(name, target, shipped) is False:
                broken.append(f"{name}: {target}")
    return broken


# ------------------------------------------------------------ the build

def build(out: Path, first_withheld: int, find_answers: bool = False) -> list[str]:
    """Write the handout to ``out`` (which must not exist); return the stubbed module names.
    With ``find_answers``, also refuse a function or table that gives an exercise's results
    (``answer_finder``, about a minute), other than the known ones it lists, and a known one
    of a withheld lab that is no longer shipped."""
    if out.exists():
        raise FileExistsError(f"{out} exists: the handout is written to a new folder")
    labs = withheld_labs(first_withheld)
    labs_of_files = syllabus.labs_of_files()
    stubbed = {path.relative_to(REPO).as_posix(): path for path in modules_with_exercises()
               if set(labs_of_files[path.stem]) & labs}
    shipped = {name for name in tracked_files() if not left_out(name, first_withheld)}
    for name in sorted(shipped):
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        text = (runs_student_file(stubbed_source(stubbed[name], labs), stubbed[name].stem)
                if name in stubbed else shipped_text(name, shipped | set(WRITTEN)))
        if text is None:
            shutil.copy2(REPO / name, target)
        else:
            target.write_text(text)
    names = sorted(path.stem for path in stubbed.values())
    (out / WITHHELD_LIST.relative_to(REPO)).write_text("".join(f"{n}\n" for n in names))
    (out / "README.md").write_text(student_readme(first_withheld))
    (out / "pytest.ini").write_text(PYTEST_INI)
    broken = broken_links(out)
    if broken:
        raise ValueError("the handout's pages link to files it lacks: " + "; ".join(broken))
    leaks = answer_leaks.leaks(out, sorted(shipped | set(WRITTEN)), labs)
    if leaks:
        raise ValueError(f"the handout would give {len(leaks)} answer(s) away: "
                         + "; ".join(map(str, leaks)))
    if find_answers:
        new, gone = answer_finder.refused(answer_finder.answers(out, sorted(shipped), labs), labs)
        if new:
            raise ValueError(f"the handout would give {len(new)} answer(s) away: "
                             + "; ".join(map(str, new)))
        if gone:
            raise ValueError(f"answer_finder.KNOWN lists {gone}, no longer shipped: take them "
                             "off the list")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to create")
    parser.add_argument("--withhold-from", default="lab0",
                        help="the first withheld lab: it and every later one (default lab0: "
                             "all of them)")
    parser.add_argument("--no-answer-finder", action="store_true",
                        help="skip trying the shipped functions and tables on the exercises "
                             "(saves about a minute; the line-by-line leak check still runs)")
    args = parser.parse_args(argv)
    match = re.fullmatch(r"(?:lab)?(\d+)", args.withhold_from)
    if not match:
        parser.error(f"--withhold-from {args.withhold_from}: give a lab, e.g. lab3")
    try:
        names = build(args.out, int(match.group(1)), find_answers=not args.no_answer_finder)
    except FileExistsError as error:
        parser.error(str(error))
    except ValueError as error:
        print(f"handout: {error}", file=sys.stderr)
        return 1
    print(f"wrote the handout to {args.out}; stubbed: {', '.join(names) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
