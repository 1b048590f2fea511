"""Is this machine ready for the labs? The set-up check, in a few seconds:

    python -m reference_impl.course.setup_check

It checks that torch imports, that ranks start on this machine's CPU (two processes started
by the kit's launcher, an all-reduce over gloo) and that the notebooks' kernel starts and
imports this copy of the kit. One line per check; the exit status is 1 if one fails.
"""
from __future__ import annotations

import sys
from pathlib import Path

RANKS = 2
KERNEL = "python3"  # the kernel the notebooks name
KERNEL_TIMEOUT = 120  # seconds: a kernel's first start on a laptop can take a while


def torch_imports() -> str:
    import torch

    return f"torch {torch.__version__} imports"


def _rank_plus_one() -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    return value.item()


def ranks_start() -> str:
    from reference_impl.comm.launcher import launch

    expected = RANKS * (RANKS + 1) / 2
    found = launch(_rank_plus_one, RANKS, backend="gloo", timeout=120)
    if found != [expected] * RANKS:
        raise RuntimeError(f"{RANKS} CPU ranks all-reduced 1..{RANKS} to {found}, "
                           f"not {expected:g} on every rank")
    return f"{RANKS} CPU ranks start and all-reduce over gloo"


def kernel_starts() -> str:
    import nbformat
    from nbclient import NotebookClient

    import reference_impl

    cell = nbformat.v4.new_code_cell("import reference_impl; print(reference_impl.__file__)")
    notebook = nbformat.v4.new_notebook(cells=[cell])
    NotebookClient(notebook, kernel_name=KERNEL, timeout=KERNEL_TIMEOUT).execute()
    seen = "".join(output.get("text", "") for output in cell.outputs).strip()
    if Path(seen) != Path(reference_impl.__file__):
        raise RuntimeError(f"the kernel imports the kit from {seen or 'nowhere'}, not from "
                           f"{reference_impl.__file__}: install the kit into the environment "
                           "Jupyter runs in (pip install -e \".[dev]\")")
    return f"the notebooks' kernel ({KERNEL}) starts and imports this copy of the kit"


CHECKS = (torch_imports, ranks_start, kernel_starts)


def main() -> int:
    failed = 0
    for check in CHECKS:
        try:
            print(f"ok: {check()}", flush=True)
        except Exception as error:  # every failure is reported, and the next check still runs
            failed += 1
            print(f"FAILED: {check.__name__.replace('_', ' ')}: {type(error).__name__}: {error}",
                  flush=True)
    print("ready for the labs" if not failed else f"{failed} of {len(CHECKS)} checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
