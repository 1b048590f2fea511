"""How long does a launch take? Start-up of 2, 4 and 8 CPU ranks, fork versus spawn.

    python -m reference_impl.benchmarks.launcher_startup [--repeats 5] [--suite]

A launch is timed from the call to the return of every rank's result, with a trivial
function that does one barrier: process start, process-group rendezvous, teardown. The
median of ``--repeats`` launches is printed, and the ratio spawn/fork from the same run.
``--suite`` also times the whole test suite (``pytest -q``).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch.distributed as dist

from reference_impl.launcher import launch


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

    print(f"{'ranks':>5}  {'fork (s)':>9}  {'spawn (s)':>9}  {'spawn/fork':>10}")
    for world_size in (2, 4, 8):
        fork = median_launch_seconds(world_size, "fork", args.repeats)
        spawn = median_launch_seconds(world_size, "spawn", max(1, args.repeats // 2))
        print(f"{world_size:>5}  {fork:>9.3f}  {spawn:>9.3f}  {spawn / fork:>9.1f}x")
    if args.suite:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q"], capture_output=True,
                                text=True)
        summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "?"
        print(f"\nwhole suite: {time.perf_counter() - start:.1f} s ({summary})")


if __name__ == "__main__":
    main()
