"""How long does a launch take? Start-up of 2, 4 and 8 CPU ranks by start method.

    python -m reference_impl.benchmarks.launcher_startup [--repeats 5] [--suite]

A launch is timed from the call to the return of every rank's result, with a trivial
function that does one barrier: process start, process-group rendezvous, teardown. The
median of ``--repeats`` launches is printed for the launcher's default (ranks forked from the
rank server, after its one-time start, which is timed separately), for ``fork`` (ranks
forked from the caller: the fastest, and unsafe on GPU machines, so skipped there) and for
``spawn`` (a fresh interpreter per rank), with the ratios to the default from the same run.
``--suite`` also times the whole test suite (``pytest -q``).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch.distributed as dist

from reference_impl.comm.device import gpu_count
from reference_impl.comm.launcher import launch


def barrier_only() -> None:
    dist.barrier()


def median_launch_seconds(world_size: int, start_method: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        launch(barrier_only, world_size, backend="gloo", start_method=start_method)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--suite", action="store_true", help="also time `pytest -q`")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    launch(barrier_only, 2, backend="gloo")
    print(f"first launch, 2 ranks, starting the rank server (once per process): "
          f"{time.perf_counter() - start:.2f} s\n")
    fork_allowed = gpu_count() == 0
    print(f"{'ranks':>5}  {'forkserver (s)':>14}  {'fork (s)':>9}  {'spawn (s)':>9}  "
          f"{'fork/forkserver':>15}  {'spawn/forkserver':>16}")
    for world_size in (2, 4, 8):
        server = median_launch_seconds(world_size, "forkserver", args.repeats)
        fork = median_launch_seconds(world_size, "fork", args.repeats) if fork_allowed else None
        spawn = median_launch_seconds(world_size, "spawn", max(1, args.repeats // 2))
        fork_text = (f"{fork:>9.3f}  {fork / server:>14.2f}x" if fork is not None
                     else f"{'-':>9}  {'(GPU: unsafe)':>15}")
        print(f"{world_size:>5}  {server:>14.3f}  {fork_text}  {spawn:>9.3f}  "
              f"{spawn / server:>15.1f}x")
    if args.suite:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q"], capture_output=True,
                                text=True)
        summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "?"
        print(f"\nwhole suite: {time.perf_counter() - start:.1f} s ({summary})")


if __name__ == "__main__":
    main()
