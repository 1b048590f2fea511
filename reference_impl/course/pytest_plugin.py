"""The kit's pytest plugin: grading options, fixtures and the per-lab summary.

Registered as an entry point (``pytest11`` in ``pyproject.toml``), so every pytest run loads it
and ``pytest --impl path/to/submission -m lab0`` works with the submission anywhere. Options:
``--impl``, ``--backend``, ``--sandbox``/``--sandbox-hide``, the limits (``--launch-timeout``,
``--budget``, ``--after-hang``, ``--output-limit``) and ``--grading-log``; the summary gives each
lab's progress. This module holds the options, fixtures and hooks; one graded run's limits, log,
sandbox and view are :mod:`reference_impl.course.graded_run`'s, the summary
:mod:`reference_impl.course.lab_summary`'s. What each does: docs/grading.md; how graded tests are
written: ``reference_impl.course.grading`` and docs/grading.md, 'Writing a graded test'.
"""
import os
import re
import signal
import threading
from pathlib import Path

import pytest

from reference_impl.comm.device import BACKENDS, gpu_count
from reference_impl.comm.launcher import DEFAULT_TIMEOUT, launch
from reference_impl.course import lab_summary, sandboxing, sweeps, syllabus
from reference_impl.course.grade.safe_text import head_and_tail
from reference_impl.course.graded_run import (DEFAULT_AFTER_HANG, DEFAULT_OUTPUT_LIMIT,
                                              DEFAULT_SUBMISSION_BUDGET, HIDDEN, GradedRun)
from reference_impl.course.grading import Implementation

# A last line of defence for graders: no single test may run longer than this (pytest-timeout),
# unless the run sets its own limit.
DEFAULT_TEST_TIMEOUT = 300
ALONE = "alone"  # the marker of tests that compare wall-clock times
LOG_TEXT_LIMIT = 8_000  # characters of a test's failure message or output in the grading log
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
    group.addoption("--launch-timeout", type=float, default=None,
                    help=f"seconds one launch may take at most, from its start (so the "
                         f"submission's imports count), a test's own longer limit included "
                         f"(default: the test's limit, else {DEFAULT_TIMEOUT:g})")
    group.addoption("--budget", type=float, default=None,
                    help="seconds the whole graded run may take; then the "
                         "remaining graded tests fail at once (default: "
                         f"{DEFAULT_SUBMISSION_BUDGET:g} when one submission is graded, else "
                         "none)")
    group.addoption("--sandbox", choices=sandboxing.MODES, default="auto",
                    help="run each graded launch in a sandbox of its own: where one can be "
                         "made (auto, the default), always (namespaces), as a user of its "
                         "own where no namespace can be made (user: root only) or never (none)")
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
                  hidden=grading.in_hidden_tier(report.nodeid), outcome=report.outcome,
                  duration=getattr(report, "duration", 0.0),
                  message=head_and_tail(report.longreprtext if report.failed else "",
                                        LOG_TEXT_LIMIT),
                  output=head_and_tail(output, LOG_TEXT_LIMIT) if report.failed else "")


def pytest_sessionfinish(session, exitstatus):
    """Runs before the terminal's summary: the failures of labs not started leave its list of
    failures (see :func:`fold_not_started`); the grading log is closed."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        fold_not_started_of(session.config, reporter.stats)
    grading = getattr(session.config, "grading", None)
    if grading is not None and grading.view is not None:
        grading.view.close()
    if grading is not None and grading.log is not None:
        grading.write(event="finished", exitstatus=int(exitstatus))
        grading.log.close()
        grading.log = None




def fold_not_started_of(config, stats) -> None:
    grading = getattr(config, "grading", None)
    lab_summary.fold_not_started(stats, getattr(grading, "lab_of_test", {}))


def _lab_of(report):
    grading = getattr(_config, "grading", None)
    return lab_summary.lab_of(report, getattr(grading, "lab_of_test", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After a run that included graded tests, print passed/total per lab."""
    lab_summary.write(terminalreporter, config)
