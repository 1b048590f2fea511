"""A term of the course, lived in the student handout (``tests/support/handout_runs.py``: the
handout's own library only, nothing of this repository importable).

* **A fresh clone**: a plain ``pytest``, the handout's one configuration and no warning in its
  header, fails every graded test of every lab on the untouched stubs, each with the
  not-implemented hint, and reads every lab as not started, no traceback printed.
* **Start of term** (the README's handout command: every lab withheld). Lab by lab in course
  order, the student hands in that lab's files and every earlier lab's (modules and notebook,
  every exercise done, as ``make_labs`` writes them solved): the README's student command for
  the lab passes every graded test, the lab's notebook runs top to bottom, and the world sizes
  its tests launched are the GPUs the syllabus says it needs.
* **Releases** (``--withhold-from labN``: labs before N released). A student who hands in lab
  N alone, the earlier labs' files left unfinished, passes lab N's graded tests: the README's
  "stuck on lab 2, you can still do lab 3 once lab 2's solutions are released" (the notebook
  runs on the same modules as at the start of term, where it is checked). Checked for each
  lab that builds on an earlier one (:func:`earlier_labs_used`: its notebook or files import,
  through the library, a module an earlier lab writes); for the others the release handout
  differs from the start-of-term one only in files the lab never loads.
* Before lab 2 is released, lab 3 runs on the student's own lab 2 files, and its checks say so.

Each step is a handout of its own, so the steps of the selected tests run side by side
(:data:`AT_ONCE` at a time).
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.graded_cases import assert_every_case_fails_with_the_hint, cases_of
from support.handout_runs import build_handout, handout_python, in_handout, run_notebook, student_command
from reference_impl.course import make_labs, syllabus
from reference_impl.course.grading import modules_imported
from support import REPO

# A test waits for its own step, and while the steps queue, for those before it too: its limit
# is the term's, each run in a step keeping its own (tests/support/nested.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

AT_ONCE = 4  # steps at a time: each is mostly waiting on ranks and kernels starting
# Every lab's graded tests in one run (about 3 minutes alone on 2 cores, more beside other
# steps): below the term's limit, above a single run's.
EVERY_LAB_LIMIT = 600
# The start-of-term handout runs the answer finder (tests/course/test_handout.py); each step's
# handout here skips it.
NO_FINDER = "--no-answer-finder"
LABS = syllabus.LABS


def earlier_labs_used(lab) -> set[str]:
    """The earlier labs whose modules ``lab``'s solved notebook and files reach, following the
    library's imports (``grading.modules_imported``: re-exports through packages included)."""
    notebook = json.loads((REPO / "solutions" / f"{lab.notebook}.ipynb").read_text())
    texts = ["\n".join(line for line in "".join(cell["source"]).splitlines()
                       if not line.lstrip().startswith(("%", "!")))  # IPython's magics and shell
             for cell in notebook["cells"] if cell["cell_type"] == "code"]
    texts += [path.read_text() for path in make_labs.modules_with_exercises()
              if path.stem in lab.files]
    labs_of_files, reached = syllabus.labs_of_files(), set()
    while texts:
        tree = ast.parse(texts.pop())
        for module in {m for node in ast.walk(tree) for m in modules_imported(node)} - reached:
            source = _library_source(module)
            if source:
                reached.add(module)
                texts.append(source.read_text())
    return {earlier for module in reached for earlier in labs_of_files.get(module.split(".")[-1], ())
            if syllabus.lab(earlier).number < lab.number}


def test_each_lab_says_the_earlier_labs_it_builds_on():
    """The syllabus's ``builds_on`` (in the course maps and atop each notebook) is what the
    lab's notebook and files reach."""
    for lab in LABS:
        used = sorted(syllabus.lab(earlier).number for earlier in earlier_labs_used(lab))
        assert list(lab.builds_on) == used, (f"{lab.marker} builds on labs {used}, the syllabus "
                                             f"says {list(lab.builds_on)}")


def _library_source(module: str) -> Path | None:
    """The file of a library module; None for anything else (a name imported from a module)."""
    if not module.startswith("reference_impl"):
        return None
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


# --withhold-from lab0 is the start of term; a lab that builds on no earlier lab is the same there
RELEASES = [lab for lab in LABS if lab.number > 0 and earlier_labs_used(lab)]


def hand_in(handout: Path, solved: dict[str, str], labs) -> None:
    """Put the solved student files of ``labs`` into the handout's ``labs/``."""
    names = {name for lab in labs for name in (*lab.files, lab.notebook)}
    for file_name, text in solved.items():
        if Path(file_name).stem in names:
            (handout / "labs" / file_name).write_text(text)


def launched_gpus(log: Path) -> int:
    """The largest world size a graded run launched on the chosen backend (helpers run on one
    CPU process, gloo, whatever the backend): the GPUs it needs under NCCL."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return max((r["world_size"] for r in records
                if r.get("event") == "launch" and r["backend"] != "gloo"), default=0)


class Step:
    """One step of the term in a handout of its own."""

    def __init__(self, folder: Path, python: Path, solved: dict[str, str]):
        self.folder, self.python, self.solved = folder, python, solved

    def graded(self, handout: Path, lab, *options: str):
        """The student's command for ``lab``, run as typed; ``options`` reach pytest through
        PYTEST_ADDOPTS, which leaves the command as it is printed."""
        addopts = " ".join(("-p no:cacheprovider", *options))
        return in_handout(self.python, handout, student_command(lab), PYTEST_ADDOPTS=addopts)

    def start_of_term(self, lab) -> dict:
        handout = build_handout(self.folder, NO_FINDER)
        hand_in(handout, self.solved, [each for each in LABS if each.number <= lab.number])
        log = self.folder / "grading.jsonl"
        result = {"graded": self.graded(handout, lab, f"--grading-log={log}"),
                  "notebook": run_notebook(self.python, handout,
                                           handout / "labs" / f"{lab.notebook}.ipynb")}
        result["gpus"] = launched_gpus(log) if log.exists() else None
        return result

    def release(self, lab) -> dict:
        handout = build_handout(self.folder, f"--withhold-from {lab.marker}", NO_FINDER)
        hand_in(handout, self.solved, [lab])
        return {"graded": self.graded(handout, lab)}

    def fresh(self) -> dict:
        handout = build_handout(self.folder, NO_FINDER)
        report = self.folder / "stubs.xml"
        process = in_handout(self.python, handout, "pytest", timeout=EVERY_LAB_LIMIT,
                             PYTEST_ADDOPTS=f"-p no:cacheprovider --junitxml={report}")
        return {"pytest": process, "cases": cases_of(report) if report.exists() else {}}

    def lab3_before_lab2_is_released(self) -> dict:
        handout = build_handout(self.folder, NO_FINDER)
        hand_in(handout, self.solved, [syllabus.lab("lab3")])
        return {"graded": self.graded(handout, syllabus.lab("lab3"))}


def step_of(item) -> tuple:
    """The step a test of this module reads: ("start", "lab3"), ("release", "lab3"),
    ("fresh",) or ("lab3 early",)."""
    lab = item.callspec.params["lab"].marker if hasattr(item, "callspec") else None
    return {"test_start_of_term_lab_by_lab": ("start", lab),
            "test_a_release_lets_a_student_do_a_lab_without_the_earlier_ones": ("release", lab),
            "test_in_a_fresh_clone_pytest_reads_every_lab_as_not_started": ("fresh",),
            }.get(item.originalname, ("lab3 early",))


@pytest.fixture(scope="module")
def term(request, tmp_path_factory):
    """The steps of the selected tests, started together the first time a test asks for one:
    ``term[key]()`` waits for step ``key`` and returns what it ran."""
    python = handout_python(tmp_path_factory.mktemp("handout-python"))
    solved = {path.name: text for path, text in make_labs.student_files(solved=True).items()}
    methods = {"start": "start_of_term", "release": "release", "fresh": "fresh",
               "lab3 early": "lab3_before_lab2_is_released"}
    keys = dict.fromkeys(step_of(item) for item in request.session.items
                         if item.path == Path(__file__) and "term" in item.fixturenames)
    pool = ThreadPoolExecutor(AT_ONCE)
    futures = {}
    for key in keys:
        step = Step(tmp_path_factory.mktemp("-".join(key).replace(" ", "-")), python, solved)
        arguments = [syllabus.lab(key[1])] if len(key) > 1 else []
        futures[key] = pool.submit(getattr(step, methods[key[0]]), *arguments)
    yield {key: future.result for key, future in futures.items()}
    pool.shutdown(cancel_futures=True)
    shutil.rmtree(python.parents[1], ignore_errors=True)


def assert_passes(process, lab, what: str) -> None:
    tests = re.search(rf"^{lab.marker}: (\d+)/(\d+) passed$", process.stdout, re.MULTILINE)
    assert process.returncode == 0 and tests and tests[1] == tests[2], (
        f"{what}: `{student_command(lab)}` did not pass:\n{process.stdout[-4000:]}"
        f"{process.stderr[-2000:]}")


def assert_runs(process, lab, what: str) -> None:
    assert process.returncode == 0, (f"{what}: labs/{lab.notebook}.ipynb, solved, failed:\n"
                                     f"{process.stderr[-5000:]}")


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.marker)
def test_start_of_term_lab_by_lab(term, lab):
    ran = term[("start", lab.marker)]()
    what = f"start-of-term handout, labs 0 to {lab.number} handed in"
    assert_passes(ran["graded"], lab, what)
    assert_runs(ran["notebook"], lab, what)
    assert ran["gpus"] == lab.gpus, (
        f"{lab.marker}'s graded tests launched at most {ran['gpus']} ranks on the chosen "
        f"backend; reference_impl/course/syllabus.py says it needs {lab.gpus} GPUs under NCCL")


def test_in_a_fresh_clone_pytest_reads_every_lab_as_not_started(term):
    """Every graded test of every lab fails on the untouched stubs, with the hint, and the
    summary reads each lab as not started, no traceback printed."""
    ran = term[("fresh",)]()
    process = ran["pytest"]
    header = process.stdout.split(" test session starts ", 1)[1].split("\ncollected", 1)[0]
    assert "\nconfigfile: pytest.ini\n" in header and "WARNING" not in header, header
    progress = re.findall(r"^(lab\d+): not started \(0/\d+\)$", process.stdout, re.MULTILINE)
    assert progress == [lab.marker for lab in LABS], process.stdout[-3000:]
    assert "Traceback" not in process.stdout and " FAILURES " not in process.stdout, (
        process.stdout[-3000:])
    assert re.search(r"=+ \d+ not started in ", process.stdout), process.stdout[-500:]
    assert_every_case_fails_with_the_hint(process, ran["cases"])


@pytest.mark.parametrize("lab", RELEASES, ids=lambda lab: lab.marker)
def test_a_release_lets_a_student_do_a_lab_without_the_earlier_ones(term, lab):
    ran = term[("release", lab.marker)]()
    what = f"handout --withhold-from {lab.marker}, only {lab.marker}'s files handed in"
    assert_passes(ran["graded"], lab, what)


def test_before_lab2_is_released_lab3_runs_on_the_student_s_lab2_and_says_so(term):
    process = term[("lab3 early",)]()["graded"]
    assert process.returncode != 0, process.stdout[-3000:]
    assert "NotImplementedError: lab2:" in process.stdout, process.stdout[-3000:]
    assert re.search(r"^lab3: \d+ of its failures stopped in lab2's unfinished exercises",
                     process.stdout, re.MULTILINE), process.stdout[-3000:]


def test_the_labs_that_build_on_earlier_ones_are_found():
    """The releases checked above are those of labs that build on earlier ones: the import
    analysis must find what the course states (lab 3's attention on lab 2's layers, lab 5's
    hybrid on the TP and pipeline labs), or it would leave releases unchecked."""
    assert earlier_labs_used(syllabus.lab("lab0")) == set()
    assert "lab2" in earlier_labs_used(syllabus.lab("lab3"))
    assert {"lab2", "lab4"} <= earlier_labs_used(syllabus.lab("lab5"))
