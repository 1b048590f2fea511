"""The kit's pytest plugin: grading options, fixtures and the per-lab summary.

Registered as an entry point (``pytest11`` in ``pyproject.toml``), so every pytest run loads it
and ``pytest --impl path/to/submission -m lab0`` works with the submission anywhere. Options:
``--impl``, ``--backend``, ``--sandbox``/``--sandbox-hide``, the limits (``--launch-timeout``,
``--budget``, ``--after-hang``, ``--output-limit``) and ``--grading-log``; the summary gives each
lab's progress. What each does: docs/grading.md; how graded tests are written:
``reference_impl.course.grading`` and docs/grading.md, 'Writing a graded test'.
"""
import collections
import dataclasses
import json
import os
import re
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from reference_impl.comm.sandbox import Sandbox
from reference_impl.course import sandboxing, sweeps, syllabus, view
from reference_impl.course.grade.safe_text import head_and_tail
from reference_impl.course.grading import Implementation, reference_imports
from reference_impl.comm.device import BACKENDS, gpu_count
from reference_impl.comm.launcher import DEFAULT_TIMEOUT, launch
from reference_impl.comm.rank_failures import LaunchTimeout

# A last line of defence for graders: no single test may run longer than this (pytest-timeout),
# unless the run sets its own limit.
DEFAULT_TEST_TIMEOUT = 300
ALONE = "alone"  # the marker of tests that compare wall-clock times
HIDDEN = "hidden"  # the marker of the graded checks under tests/labs/hidden/, not handed out
DEFAULT_AFTER_HANG = 5.0  # seconds a launch may take once the submission has hung
DEFAULT_OUTPUT_LIMIT = 8_000  # bytes of each rank's output kept, per launch
DEFAULT_SUBMISSION_BUDGET = 900.0  # seconds a graded run of one submission may take
LOG_TEXT_LIMIT = 8_000  # characters of a test's failure message or output in the grading log
# Bytes of a student file read in pytest's own process, to look for imports of the reference: 15
# times the largest exercise file (zero.py, 17.5 kB); parsing costs hundreds of times its size.
SOURCE_LIMIT = 256 << 10
_LAB_MARKER = re.compile(r"^lab\d+$")


def pytest_addoption(parser):
    group = parser.getgroup("parallelism lab kit")
    group.addoption("--backend", choices=BACKENDS, default="auto",
                    help="process-group backend for multi-rank tests (default: auto)")
    group.addoption("--impl", action="append", default=None,
                    help="implementation the graded tests check: reference (default: the ini "
                         "option impl, else reference), labs "
                         "(the student files in labs/), or PATH (a submitted copy of labs/). "
                         "Given several times, every graded test runs once per "
                         "implementation (to compare variants, as the kit's mistake catalogue "
                         "does; grade students one per run, so limits and flags stay theirs)")
    group.addoption("--launch-timeout", type=float, default=DEFAULT_TIMEOUT,
                    help=f"seconds one launch may take (default {DEFAULT_TIMEOUT:g})")
    group.addoption("--budget", type=float, default=None,
                    help="seconds the whole graded run may take; then the "
                         "remaining graded tests fail at once (default: "
                         f"{DEFAULT_SUBMISSION_BUDGET:g} when one submission is graded, else "
                         "none)")
    group.addoption("--sandbox", choices=sandboxing.MODES, default="auto",
                    help="run each graded launch in a sandbox of its own: where one can be "
                         "made (auto, the default), always (namespaces) or never (none)")
    group.addoption("--sandbox-hide", action="append", default=[], metavar="PATH",
                    help="a folder the sandboxed code must not see (it finds it empty)")
    group.addoption("--memory-limit", type=float, default=None, metavar="GIB",
                    help="writable memory of each sandboxed process, in GiB (default: a "
                         "share of half the machine's, at least 2)")
    group.addoption("--after-hang", type=float, default=DEFAULT_AFTER_HANG,
                    help="seconds a launch may take once one has hung (default "
                         f"{DEFAULT_AFTER_HANG:g})")
    group.addoption("--output-limit", type=int, default=DEFAULT_OUTPUT_LIMIT,
                    help=f"bytes of each rank's output kept per launch (default "
                         f"{DEFAULT_OUTPUT_LIMIT})")
    group.addoption("--sweep-seed", type=int, default=sweeps.DEFAULT_SEED,
                    help="the seed of the configurations graded checks sweep (default "
                         f"{sweeps.DEFAULT_SEED}, what every student is graded on); a failure "
                         "prints its seed and case")
    group.addoption("--grading-log", default=None,
                    help="append the graded tests' outcomes to this file as JSON lines")
    parser.addini("impl", "the --impl of a run that gives none (a student handout: labs)",
                  default="reference")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    for lab in syllabus.LABS:
        config.addinivalue_line("markers", f"{lab.marker}: graded tests of lab {lab.number} "
                                           f"({lab.topic})")
    config.addinivalue_line("markers", "slow: runs nested in a test (pytest, notebooks, decks, "
                                       "documented commands), waits on purpose (a time limit, "
                                       "a killed launch), or is a hidden check (the public "
                                       "checks run the same functions); the fast loop is "
                                       "-m 'not slow'")
    config.addinivalue_line("markers", f"{HIDDEN}: a graded check that stays with the grader "
                                       "(tests/labs/hidden/, not in the handout), shown to "
                                       "students after the due date")
    config.addinivalue_line("markers", f"{ALONE}: compares wall-clock times, so it needs the "
                                       f"cores to itself: skipped in a pytest-xdist worker (-n); "
                                       f"run it with -m {ALONE}")
    # Where no configuration file applies (a submission outside the repository given as the
    # only path), the kit's per-test limit still holds.
    if config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is None \
            and not config.getini("timeout"):
        config.option.timeout = DEFAULT_TEST_TIMEOUT
    # A test module that cannot be imported fails its own tests, not the whole graded run.
    config.option.continue_on_collection_errors = True
    try:
        chosen = config.getoption("--impl") or [config.getini("impl")]
        config.implementations = [Implementation.from_option(value) for value in chosen]
        config.implementation = config.implementations[0]
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    config.grading = GradedRun(config)
    # A graded run on a student's files shows each failure's message and the lines it passed
    # through, not every frame's arguments (pages of tensors): pytest's short tracebacks.
    if any(each.folder is not None for each in config.implementations) and \
            config.option.tbstyle == "auto":
        config.option.tbstyle = "short"
    if config.grading.implementation.folder is not None and \
            threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum, frame):
    """SIGTERM ends a graded run as Ctrl-C does: with its summary, saying what ended it."""
    reason = f"the graded run received {signal.Signals(signum).name}"
    if _config is not None:
        _config.grading.interrupted = reason
    raise KeyboardInterrupt(reason)


class GradedRun:
    """The limits of one graded run (one submission) and its log."""

    def __init__(self, config):
        self.implementation = config.implementation
        self.launch_timeout = config.getoption("--launch-timeout")
        self.budget = config.getoption("--budget")
        one_submission = len(config.implementations) == 1 and \
            self.implementation.folder is not None
        if self.budget is None and one_submission:
            self.budget = DEFAULT_SUBMISSION_BUDGET
        self.sandbox_mode = config.getoption("--sandbox")
        self.hidden = tuple(config.getoption("--sandbox-hide"))
        memory = config.getoption("--memory-limit")
        self.memory_bytes = None if memory is None else int(memory * (1 << 30))
        self.sandboxed = None  # decided once graded tests are collected (decide_sandbox)
        self.view = None  # what a submission's code sees of the kit, made at its first launch
        self.sandbox_line = ""
        self.interrupted = ""  # what ended the run early, if something did
        self.after_hang = config.getoption("--after-hang")
        self.output_limit = config.getoption("--output-limit")
        self.started = time.monotonic()
        self.hung_in = None  # the first test whose launch hung
        log = config.getoption("--grading-log")
        self.log = open(log, "a", buffering=1) if log else None
        self.findings = []
        self.lab_of_test = {}  # nodeid -> its lab marker, once collected
        self.hidden_tests = set()  # the nodeids of the graded tests marked hidden
        if self.implementation.folder is not None:
            for name, labs in syllabus.labs_of_files().items():
                for finding in imports_of_the_reference(self.implementation.folder, name):
                    self.findings.append((labs, finding))
                    self.write(event="flag", labs=labs, text=finding)

    def write(self, **record) -> None:
        if self.log is not None:
            self.log.write(json.dumps(record) + "\n")

    def decide_sandbox(self) -> str:
        """Whether this run's launches are sandboxed (decided once: it starts the ranks'
        server), and the line that says what that covers."""
        if self.sandboxed is None:
            try:
                self.sandboxed, self.sandbox_line = sandboxing.choose(self.sandbox_mode)
            except ValueError as error:
                pytest.exit(str(error), returncode=pytest.ExitCode.USAGE_ERROR)
        return self.sandbox_line

    def sandbox(self, scratch: Path, implementation) -> Sandbox | None:
        """The sandbox of this run's launches (None without one): ``scratch`` (the run's
        temporary folder) writable, the implementation's folder readable; a submission's
        launches see the kit as a student does (:mod:`reference_impl.course.view`)."""
        self.decide_sandbox()
        if not self.sandboxed:
            return None
        folder = implementation.folder
        readable, hidden, replaced = (), self.hidden, ()
        if folder is not None:
            if self.view is None:
                self.view = view.students_view(sorted(set(self.lab_of_test.values())))
            readable, hidden = (str(folder),), (*self.hidden, *self.view.hidden)
            replaced = self.view.replaced
        return Sandbox(writable=(str(scratch),), cache=str(scratch / "sandbox-cache"),
                       readable=readable, hidden=hidden, replaced=replaced,
                       memory_bytes=self.memory_bytes)

    def seen_as_a_student(self, implementation) -> Implementation:
        """``implementation``, its files standing in for the modules its view shows as stubs."""
        if self.view is None:
            return implementation
        return dataclasses.replace(implementation, stood_in=self.view.stubbed)

    def launch(self, fn, world_size, args, kwargs, backend, timeout, nodeid, implementation,
               scratch):
        """The launcher under this run's limits, in its sandbox, with a data-only result."""
        limit = timeout or self.launch_timeout
        if self.hung_in is not None:
            limit = min(limit, self.after_hang)
        if self.budget is not None:
            remaining = self.budget - (time.monotonic() - self.started)
            if remaining <= 0:
                pytest.fail(f"not run: the graded run's time budget of {self.budget:g} s "
                            f"(--budget) is spent{self._hang_note()}", pytrace=False)
            limit = min(limit, remaining)
        self.write(event="launch", nodeid=nodeid, world_size=world_size, backend=backend)
        sandbox = self.sandbox(scratch, implementation)  # makes the view, where there is one
        try:
            return launch(fn, world_size, *args, backend=backend, timeout=limit,
                          results="data", output_limit=self.output_limit,
                          rank_setup=self.seen_as_a_student(implementation).enter,
                          sandbox=sandbox, **kwargs)
        except LaunchTimeout as error:
            self.write(event="hang", nodeid=nodeid, world_size=world_size)
            if self.hung_in is not None:
                pytest.fail(f"{error}{self._hang_note()}", pytrace=False)
            self.hung_in = nodeid
            raise

    def _hang_note(self) -> str:
        if self.hung_in is None:
            return ""
        return (f" (the submission already hung in {self.hung_in}, so launches after it get "
                f"at most {self.after_hang:g} s)")


def imports_of_the_reference(folder: Path, name: str) -> list[str]:
    """Where student file ``<name>.py`` imports the reference it must write (see
    :func:`reference_imports`), read in pytest's own process within :data:`SOURCE_LIMIT`
    bytes: a file that is larger, not a plain file, or that the parser cannot take is not
    read, and is flagged for a look by hand (no pass, no crash)."""
    path = folder / f"{name}.py"
    if not path.exists():
        return []  # the graded tests report it
    unchecked = f"{path.name} was not checked for imports of the reference implementation"
    try:
        found = path.stat()
    except OSError as error:
        return [f"{unchecked}: {type(error).__name__}"]
    if not stat.S_ISREG(found.st_mode):
        return [f"{unchecked}: it is not a plain file (look at it by hand)"]
    if found.st_size > SOURCE_LIMIT:
        return [f"{unchecked}: it is {found.st_size:,} bytes, more than the {SOURCE_LIMIT:,} "
                "the check reads (look at it by hand)"]
    try:
        return reference_imports(folder, [name])
    except (ValueError, RecursionError, MemoryError, OSError) as error:
        return [f"{unchecked}: the parser could not read it ({type(error).__name__})"]


def pytest_generate_tests(metafunc):
    implementations = metafunc.config.implementations
    if len(implementations) > 1 and "impl" in metafunc.fixturenames:
        metafunc.parametrize("impl", implementations, indirect=True,
                             ids=[Path(i.name).name for i in implementations])


@pytest.fixture
def impl(request):
    """The implementation under test: ``impl.module("groups")`` is its groups module, inside
    a function given to ``run_on_ranks`` or ``run_alone`` only."""
    return getattr(request, "param", request.config.implementation)


def _implementation_of(request):
    """The test's implementation (its ``impl``), or the run's."""
    if "impl" in request.fixturenames:
        return request.getfixturevalue("impl")
    return request.config.implementation


@pytest.fixture
def backend(request):
    return request.config.getoption("--backend")


@pytest.fixture
def sweep_seed(request) -> int:
    """The seed of the configurations a graded check sweeps (``--sweep-seed``; see
    ``reference_impl.course.sweeps``)."""
    return request.config.getoption("--sweep-seed")


@pytest.fixture
def run_on_ranks(request, backend, tmp_path_factory):
    """``run_on_ranks(fn, world_size, *args, timeout=None, **kwargs)``: ``fn`` on the ranks,
    on the chosen backend; every rank's result. In a graded test (one with a lab marker):
    under the run's limits, and the results as data."""
    graded = any(_LAB_MARKER.match(marker.name) for marker in request.node.iter_markers())

    def run(fn, world_size, *args, timeout=None, **kwargs):
        gpus = gpu_count()
        if backend == "nccl" and gpus < world_size:
            pytest.skip(f"needs {world_size} GPUs for nccl, this machine has {gpus}")
        if not graded:
            return launch(fn, world_size, *args, backend=backend,
                          timeout=timeout or DEFAULT_TIMEOUT, **kwargs)
        return request.config.grading.launch(fn, world_size, args, kwargs, backend, timeout,
                                             request.node.nodeid, _implementation_of(request),
                                             tmp_path_factory.getbasetemp())

    return run


@pytest.fixture
def run_alone(request, tmp_path_factory):
    """``run_alone(fn, *args, timeout=None, **kwargs)``: ``fn`` in one helper process on the
    CPU, under the run's limits; its result, as data."""

    def run(fn, *args, timeout=None, **kwargs):
        return request.config.grading.launch(fn, 1, args, kwargs, "gloo", timeout,
                                             request.node.nodeid, _implementation_of(request),
                                             tmp_path_factory.getbasetemp())[0]

    return run


def pytest_ignore_collect(collection_path, config):
    """A graded run of a submission collects the graded tests only (``test_lab*.py``): the rest
    of the suite and the solved notebooks test the kit itself, and collecting them costs
    seconds per submission."""
    if all(implementation.folder is None
           for implementation in getattr(config, "implementations", ())):
        return None
    if collection_path.is_file() and not collection_path.name.startswith("test_lab"):
        return True
    return None


def pytest_collection_modifyitems(items):
    """A notebook's cells (nbval re-executes the solved notebooks) are slow. A test that times
    things is skipped where other tests share its cores (a pytest-xdist worker), and says so.
    The checks in a ``hidden`` folder are marked hidden (and slow: the public checks run the
    same functions) and run after the others, as the batch grader runs them (one that hangs
    shortens no public check's time limit)."""
    in_worker = "PYTEST_XDIST_WORKER" in os.environ
    items.sort(key=lambda item: HIDDEN in item.path.parent.parts[-1:])  # stable: order kept
    for item in items:
        if HIDDEN in item.path.parent.parts[-1:]:
            item.add_marker(HIDDEN)
            item.add_marker(pytest.mark.slow)
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
        if in_worker and item.get_closest_marker(ALONE):
            item.add_marker(pytest.mark.skip(reason=f"compares wall-clock times: run it without "
                                                    f"-n, e.g. pytest -m {ALONE}"))


def pytest_collection_finish(session):
    grading = session.config.grading
    grading.lab_of_test = {item.nodeid: lab for item in session.items
                           for lab in [next((m.name for m in item.iter_markers()
                                             if _LAB_MARKER.match(m.name)), None)] if lab}
    graded = [item for item in session.items if item.nodeid in grading.lab_of_test]
    grading.hidden_tests = {item.nodeid for item in graded if item.get_closest_marker(HIDDEN)}
    # Each test's name in results: its file's name and its name in the file (a file outside
    # the rootdir has a node id without its path).
    grading.write(event="collected", tests=[
        {"nodeid": item.nodeid, "name": f"{item.path.name}::{item.nodeid.split('::', 1)[-1]}",
         "lab": grading.lab_of_test[item.nodeid], "hidden": item.nodeid in grading.hidden_tests}
        for item in graded])
    if grading.lab_of_test:  # decided before the first graded test (said in the summary)
        grading.decide_sandbox()


def pytest_runtest_logstart(nodeid, location):
    if _config is not None and hasattr(_config, "grading"):
        _config.grading.write(event="start", nodeid=nodeid)


def pytest_collectreport(report):
    lab = _lab_of(report) if report.failed else None
    if lab is not None:
        _write_report(report, lab, "collect")


def pytest_runtest_logreport(report):
    lab = _lab_of(report)
    if lab is not None:
        _write_report(report, lab, report.when)


_config = None  # the run's config, for the report hooks that are not given it


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    global _config
    _config = session.config


def _write_report(report, lab, phase):
    if _config is None or not hasattr(_config, "grading"):
        return
    output = "".join(text for _, text in getattr(report, "sections", [])
                     if isinstance(text, str))
    grading = _config.grading
    grading.write(event="report", nodeid=report.nodeid, lab=lab, phase=phase,
                  hidden=_in_hidden_tier(report.nodeid, grading), outcome=report.outcome,
                  duration=getattr(report, "duration", 0.0),
                  message=head_and_tail(report.longreprtext if report.failed else "",
                                        LOG_TEXT_LIMIT),
                  output=head_and_tail(output, LOG_TEXT_LIMIT) if report.failed else "")


def _in_hidden_tier(nodeid: str, grading) -> bool:
    """A test marked ``hidden``, or a module in a ``hidden`` folder that could not be
    collected (it has no tests to carry the marker)."""
    if "::" in nodeid:
        return nodeid in grading.hidden_tests
    return Path(nodeid).parent.name == HIDDEN


def pytest_sessionfinish(session, exitstatus):
    """Runs before the terminal's summary: the failures of labs not started leave its list of
    failures (see :func:`fold_not_started`); the grading log is closed."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        fold_not_started(reporter.stats)
    grading = getattr(session.config, "grading", None)
    if grading is not None and grading.view is not None:
        grading.view.close()
    if grading is not None and grading.log is not None:
        grading.write(event="finished", exitstatus=int(exitstatus))
        grading.log.close()
        grading.log = None


def graded_outcomes(stats) -> dict[str, tuple[str, bool]]:
    """nodeid -> (lab, passed every phase), from the terminal reporter's reports.

    A test module that cannot be imported has no tests, only a failed collection report:
    it counts as one failed test of the labs its file name says (``test_lab2_*.py``)."""
    outcomes = {}
    for category in ("passed", "failed", "error", NOT_STARTED, "skipped", "xfailed", "xpassed"):
        for report in stats.get(category, []):
            lab = _lab_of(report)
            if lab is not None:
                ok = outcomes.get(report.nodeid, (lab, True))[1] and category == "passed"
                outcomes[report.nodeid] = (lab, ok)
    return outcomes


_STUB = re.compile(r"NotImplementedError: (lab\d+):")
# The terminal's category for the failures of a lab not started: counted in its last line
# ("14 not started"), listed neither with the failures nor in the short summary.
NOT_STARTED = "not started"


def not_started(stats) -> set[str]:
    """The labs a student has not started: none of their tests passed and every failure
    stopped at an exercise's stub (``NotImplementedError: labN: ...``), at least one at the
    lab's own (the rest at the stubs of labs it builds on)."""
    outcomes = graded_outcomes(stats)
    stubs_met = collections.defaultdict(set)  # lab -> the labs whose stubs its failures met
    for report in stats.get("failed", []) + stats.get("error", []):
        lab = _lab_of(report)
        if lab is not None:
            stubs_met[lab].add(frozenset(_STUB.findall(report.longreprtext)))
    return {lab for lab, met in stubs_met.items()
            if all(found for found in met) and any(lab in found for found in met)
            and not any(ok for name, ok in outcomes.values() if name == lab)}


def fold_not_started(stats) -> None:
    """Move the failures of the labs not started to their own category: their tracebacks,
    one per test and all alike, would bury those of the labs in progress."""
    labs = not_started(stats)
    for category in ("failed", "error"):
        folded = [report for report in stats.get(category, []) if _lab_of(report) in labs]
        if folded:
            stats[category] = [report for report in stats[category] if report not in folded]
            stats.setdefault(NOT_STARTED, []).extend(folded)


def _stopped_in_other_labs(stats) -> collections.Counter:
    """(lab, other lab) -> how many of the lab's failed tests ran into the other lab's stubs
    in the submission's processes (in a handout, a lab builds on the student's own files of the
    labs not yet released)."""
    counts = collections.Counter()
    for report in stats.get("failed", []):
        lab, text = _lab_of(report), report.longreprtext
        other = next((found for found in _STUB.findall(text) if found != lab),
                     None) if "RankFailure" in text else None
        if lab is not None and other is not None:
            counts[lab, other] += 1
    return counts


def _lab_of(report):
    """The lab whose marker the report's test carries (not a parameter that looks like one),
    or, for a test module that could not be collected, the lab its file name says."""
    if isinstance(report, pytest.TestReport):
        grading = getattr(_config, "grading", None)
        return getattr(grading, "lab_of_test", {}).get(report.nodeid)
    if getattr(report, "failed", False):  # a collection report: named by its file
        match = re.search(r"test_(lab\d+)_", report.nodeid or "")
        return match.group(1) if match else None
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After a run that included graded tests, print passed/total per lab."""
    outcomes = graded_outcomes(terminalreporter.stats)
    not_run = {nodeid: lab for nodeid, lab in config.grading.lab_of_test.items()
               if nodeid not in outcomes}
    if not outcomes and not not_run:
        return
    outcomes.update((nodeid, (lab, False)) for nodeid, lab in not_run.items())
    terminalreporter.section(f"graded labs ({config.implementation.name})")
    folded = {_lab_of(report) for report in terminalreporter.stats.get(NOT_STARTED, [])}
    for lab in sorted({lab for lab, _ in outcomes.values()}, key=lambda name: int(name[3:])):
        results = [ok for name, ok in outcomes.values() if name == lab]
        missing = sum(name == lab for name in not_run.values())
        progress = (f"not started (0/{len(results)})" if lab in folded else
                    f"{sum(results)}/{len(results)} passed")
        hidden = [ok for nodeid, (name, ok) in outcomes.items()
                  if name == lab and _in_hidden_tier(nodeid, config.grading)]
        terminalreporter.write_line(
            f"{lab}: {progress}" + (f" ({missing} not run)" if missing else "")
            + (f" (hidden checks among them: {sum(hidden)}/{len(hidden)} passed)"
               if hidden and lab not in folded else ""))
    if config.grading.interrupted:
        terminalreporter.write_line(f"interrupted: {config.grading.interrupted}")
    for (lab, other), count in sorted(_stopped_in_other_labs(terminalreporter.stats).items()):
        terminalreporter.write_line(
            f"{lab}: {count} of its failures stopped in {other}'s unfinished exercises "
            f"(NotImplementedError: {other}: ...): {lab} builds on your {other} files until "
            f"{other}'s solutions are released")
    broken = sorted(nodeid for nodeid, (_, ok) in outcomes.items() if "::" not in nodeid and not ok)
    for nodeid in broken:
        terminalreporter.write_line(f"(could not be collected, counted as failed: {nodeid})")
    grading = config.grading
    if grading.sandbox_line:
        terminalreporter.write_line(grading.sandbox_line)
    if grading.budget is not None:
        terminalreporter.write_line(f"budget: {grading.budget:g} s for the run (--budget), "
                                    f"{grading.launch_timeout:g} s per launch "
                                    "(--launch-timeout)")
    for labs, finding in grading.findings:
        terminalreporter.write_line(f"flagged ({', '.join(labs)}): {finding}")
    if grading.hung_in is not None:
        terminalreporter.write_line(f"hung: a launch did not finish in {grading.hung_in}; "
                                    f"launches after it got at most {grading.after_hang:g} s")
