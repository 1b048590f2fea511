"""What a graded run's rank launches cost, timed apart in a fresh process as the grader's:
its imports, its sandbox probe (the rank server started, then one launch) and an empty launch
of each world size, in the sandbox the probe chose, with a data-only result as graded launches
have.

    python -m reference_impl.benchmarks.grading_cost.launches REPORT 1,2,4
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TIMER = "reference_impl.benchmarks.grading_cost.launches"
REPEATS = 3
OUTPUT_LIMIT = 8_000  # bytes of each rank's output kept, as in a graded run


def nothing() -> None:
    return None


def time_launches(world_sizes: list[int], repeats: int = REPEATS) -> dict:
    """Seconds: ``imports`` (the grader's), ``probe`` (its sandbox probe), ``launch`` (the
    median empty launch per world size); ``sandboxed``: whether the launches were."""
    started = time.perf_counter()
    import reference_impl.course.grade.cli  # noqa: F401 - the grader's imports, timed
    from reference_impl.comm.launcher import launch
    from reference_impl.comm.sandbox import Sandbox
    from reference_impl.course import sandboxing
    imported = time.perf_counter()
    sandboxed = sandboxing.probe() is None
    probed = time.perf_counter()
    seconds = {}
    for world_size in world_sizes:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            launch(nothing, world_size, backend="gloo", results="data", output_limit=OUTPUT_LIMIT,
                   sandbox=Sandbox() if sandboxed else None)
            times.append(time.perf_counter() - start)
        seconds[world_size] = statistics.median(times)
    return {"imports": imported - started, "probe": probed - imported, "sandboxed": sandboxed,
            "launch": seconds}


def calibrate(world_sizes: list[int]) -> dict:
    """:func:`time_launches` in a child process of its own (with a rank server of its own)."""
    with tempfile.TemporaryDirectory(prefix="grading-cost-launches-") as folder:
        report = Path(folder) / "launches.json"
        subprocess.run([sys.executable, "-m", TIMER, str(report),
                        ",".join(map(str, sorted(world_sizes)))], cwd=REPO, check=True)
        timed = json.loads(report.read_text())
    timed["launch"] = {int(size): seconds for size, seconds in timed["launch"].items()}
    return timed


if __name__ == "__main__":  # REPORT 1,2,4
    sizes = [int(size) for size in sys.argv[2].split(",")]
    Path(sys.argv[1]).write_text(json.dumps(time_launches(sizes)))
