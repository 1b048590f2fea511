"""Shared pytest options, fixtures and the graded-run summary.

``--impl {reference,labs,PATH}`` chooses the implementation the graded tests (marked
``lab0``, ``lab1``, ...) check: the reference (default), the student files in ``labs/``, or a
submitted copy of ``labs/`` at PATH. Tests without a lab marker always check the reference.

``--backend {auto,gloo,nccl}`` picks the process-group backend for multi-rank tests. ``auto``
uses NCCL when there is a GPU for each of a test's ranks and gloo on the CPU otherwise;
with ``nccl`` a test that needs more GPUs than the machine has is skipped, saying so.
"""
import re


import pytest
import torch

from grading import Implementation
from reference_impl.launcher import BACKENDS, launch

_LAB_MARKER = re.compile(r"^lab\d+$")


def pytest_addoption(parser):
    parser.addoption("--backend", choices=BACKENDS, default="auto",
                     help="process-group backend for multi-rank tests (default: auto)")
    parser.addoption("--impl", default="reference",
                     help="implementation the graded tests check: reference (default), labs "
                          "(the student files in labs/), or PATH (a submitted copy of labs/)")


def pytest_configure(config):
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
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if backend == "nccl" and gpus < world_size:
            pytest.skip(f"needs {world_size} GPUs for nccl, this machine has {gpus}")
        return launch(fn, world_size, *args, backend=backend, **kwargs)

    return run


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After a run that included graded tests, print passed/total per lab."""
    passed = {}  # nodeid -> (lab, passed every phase)
    for category in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for report in terminalreporter.stats.get(category, []):
            lab = next((key for key in report.keywords if _LAB_MARKER.match(key)), None)
            if lab is not None:
                ok = passed.get(report.nodeid, (lab, True))[1] and category == "passed"
                passed[report.nodeid] = (lab, ok)
    if not passed:
        return
    terminalreporter.section(f"graded labs ({config.implementation.name})")
    for lab in sorted({lab for lab, _ in passed.values()}, key=lambda name: int(name[3:])):
        results = [ok for name, ok in passed.values() if name == lab]
        terminalreporter.write_line(f"{lab}: {sum(results)}/{len(results)} passed")
