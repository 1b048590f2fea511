"""Run notebooks on this Python interpreter, the environment with the kit installed, whatever
kernels the machine has registered (as nbval's ``--nbval-current-env`` does)."""
from __future__ import annotations

import sys
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

CELL_TIMEOUT = 120  # seconds one cell may run; a lab's or a deck's cells take a few


class _ThisPythonKernels(KernelSpecManager):
    """Every kernel name resolves to ipykernel on this interpreter."""

    def get_kernel_spec(self, kernel_name):
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        return KernelSpec(argv=argv, display_name="Python 3 (this environment)", language="python")


def notebook_client(notebook, cwd: Path, timeout: int = CELL_TIMEOUT) -> NotebookClient:
    """A client that executes ``notebook`` in place, in folder ``cwd``, on this Python."""
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=_ThisPythonKernels())
    return NotebookClient(notebook, km=kernel, timeout=timeout,
                          resources={"metadata": {"path": str(cwd)}})
