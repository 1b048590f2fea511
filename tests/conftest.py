"""Shared pytest options and fixtures.

``--backend {auto,gloo,nccl}`` picks the process-group backend for multi-rank tests. ``auto``
uses NCCL when there is a GPU for each of a test's ranks and gloo on the CPU otherwise;
with ``nccl`` a test that needs more GPUs than the machine has is skipped, saying so.
"""
import pytest
import torch

from reference_impl.launcher import BACKENDS, launch


def pytest_addoption(parser):
    parser.addoption("--backend", choices=BACKENDS, default="auto",
                     help="process-group backend for multi-rank tests (default: auto)")


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
