"""The kit's pytest plugin: grading options, fixtures and the per-lab summary.

It is registered as an entry point (``pytest11`` in ``pyproject.toml``), so every pytest run
in an environment where the kit is installed loads it, whatever the arguments: the grading
commands ``pytest --impl labs -m lab2`` and ``pytest --impl path/to/submission -m lab0``
work from the repository root with the submission anywhere on disk (a ``conftest.py`` is
only loaded when pytest collects its folder, too late to define ``--impl``).

``--impl {reference,labs,PATH}`` chooses the implementation the graded tests (marked
``lab0``, ``lab1``, ...) check: the reference (default), the student files in ``labs/``, or a
submitted copy of ``labs/`` at PATH. Tests without a lab marker always check the reference.

``--backend {auto,gloo,nccl}`` picks the process-group backend for multi-rank tests. ``auto``
uses NCCL when there is a GPU for each of a test's ranks and gloo on the CPU otherwise;
with ``nccl`` a test that needs more GPUs than the machine has is skipped, saying so.
"""
import re

import pytest

from reference_impl.course.grading import Implementation
from reference_impl.comm.launcher import BACKENDS, gpu_count, launch

LABS = {
    "lab0": "collectives",
    "lab1": "rank groups",
    "lab2": "tensor-parallel layers",
    "lab3": "tensor-parallel attention",
    "lab4": "pipeline schedules",
    "lab5": "hybrid parallelism and ZeRO",
}
# A last line of defence for graders: no single test may run longer than this (pytest-timeout),
# unless the run sets its own limit.
DEFAULT_TEST_TIMEOUT = 300
_LAB_MARKER = re.compile(r"^lab\d+$")


def pytest_addoption(parser):
    group = parser.getgroup("parallelism lab kit")
    group.addoption("--backend", choices=BACKENDS, default="auto",
                    help="process-group backend for multi-rank tests (default: auto)")
    group.addoption("--impl", default="reference",
                    help="implementation the graded tests check: reference (default), labs "
                         "(the student files in labs/), or PATH (a submitted copy of labs/)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    for lab, topic in LABS.items():
        config.addinivalue_line("markers", f"{lab}: graded tests of {lab} ({topic})")
    # Where no configuration file applies (a submission outside the repository given as the
    # only path), the kit's per-test limit still holds.
    if config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is None \
            and not config.getini("timeout"):
        config.option.timeout = DEFAULT_TEST_TIMEOUT
    # A test module that cannot be imported fails its own tests, not the whole graded run.
    config.option.continue_on_collection_errors = True
    try:
        config.implementation = Implementation.from_option(config.getoption("--impl"))
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.fixture
def impl(request):
    """The implementation under test; ``impl.module("groups")`` is its groups module."""
    return request.config.implementation


@pytest.fixture
def backend(request):
    return request.config.getoption("--backend")


@pytest.fixture
def run_on_ranks(backend):
    """``run_on_ranks(fn, world_size, *args, **kwargs)``: the launcher, on the chosen backend."""

    def run(fn, world_size, *args, **kwargs):
        gpus = gpu_count()
        if backend == "nccl" and gpus < world_size:
            pytest.skip(f"needs {world_size} GPUs for nccl, this machine has {gpus}")
        return launch(fn, world_size, *args, backend=backend, **kwargs)

    return run


def graded_outcomes(stats) -> dict[str, tuple[str, bool]]:
    """nodeid -> (lab, passed every phase), from the terminal reporter's reports.

    A test module that cannot be imported has no tests, only a failed collection report:
    it counts as one failed test of the labs its file name says (``test_lab2_*.py``)."""
    outcomes = {}
    for category in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for report in stats.get(category, []):
            lab = _lab_of(report)
            if lab is not None:
                ok = outcomes.get(report.nodeid, (lab, True))[1] and category == "passed"
                outcomes[report.nodeid] = (lab, ok)
    return outcomes


def _lab_of(report):
    keywords = getattr(report, "keywords", None)
    if keywords is not None:  # a test's report
        return next((key for key in keywords if _LAB_MARKER.match(key)), None)
    if getattr(report, "failed", False):  # a collection report: named by its file
        match = re.search(r"test_(lab\d+)_", report.nodeid or "")
        return match.group(1) if match else None
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After a run that included graded tests, print passed/total per lab."""
    outcomes = graded_outcomes(terminalreporter.stats)
    if not outcomes:
        return
    terminalreporter.section(f"graded labs ({config.implementation.name})")
    for lab in sorted({lab for lab, _ in outcomes.values()}, key=lambda name: int(name[3:])):
        results = [ok for name, ok in outcomes.values() if name == lab]
        terminalreporter.write_line(f"{lab}: {sum(results)}/{len(results)} passed")
    broken = sorted(nodeid for nodeid, (_, ok) in outcomes.items() if "::" not in nodeid and not ok)
    for nodeid in broken:
        terminalreporter.write_line(f"(could not be collected, counted as failed: {nodeid})")
