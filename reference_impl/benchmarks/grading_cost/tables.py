"""The printed tables: the cost of each lab, and a class of 200 on each setup with Gradescope's
container per lab."""
from __future__ import annotations

from reference_impl.benchmarks.grading_cost.estimates import (CLASS_SIZE, GIB, SETUPS, breakdown,
                                                              class_seconds, per_run_seconds)
from reference_impl.benchmarks.grading_cost.labs import LabCost
from reference_impl.course.grade.gradescope.containers import (MEMORY_MARGIN, container,
                                                               container_seconds, memory_name)

COST_COLUMNS = ("lab", "tests", "wall s", "CPU s", "peak GiB", "start s", "servers s",
                "launches (n x s)", "checks s", "rest s", "load 1m")


def cost_table(costs: list[LabCost], calibration: dict) -> list[str]:
    """The per-lab table: a header, then one line per lab."""
    widths = [5, 5, 7, 6, 8, 7, 9, 17, 8, 7, 11]
    lines = [" ".join(f"{name:>{width}}" for name, width in zip(COST_COLUMNS, widths))]
    for cost in costs:
        parts = breakdown(cost, calibration)
        count = sum(cost.launches.values())
        each = parts["launches"] / count if count else 0.0
        cells = [cost.lab, cost.tests, f"{cost.wall:.1f}", f"{cost.cpu:.1f}",
                 f"{cost.peak_bytes / GIB:.2f}", f"{parts['start']:.1f}",
                 f"{parts['rank servers']:.1f}", f"{count} x {each:.3f}",
                 f"{parts['checks']:.1f}", f"{parts['rest']:.1f}",
                 f"{cost.load_before:.2f}-{cost.load_after:.2f}"]
        lines.append(" ".join(f"{cell:>{width}}" for cell, width in zip(cells, widths)))
    return lines


def class_table(costs: list[LabCost], students: int = CLASS_SIZE) -> list[str]:
    """A class of ``students`` graded lab by lab on each setup (the grader started once per
    machine, then its share of the class), and the Gradescope container for each lab."""
    lines = [f"{'lab':>8}" + "".join(f" {setup.name:>22}" for setup in SETUPS)
             + "  Gradescope, per submission"]
    totals = [0.0] * len(SETUPS)
    for cost in costs:
        times = [class_seconds(per_run_seconds(cost), cost.submission_seconds, students, setup)
                 for setup in SETUPS]
        totals = [total + seconds for total, seconds in zip(totals, times)]
        lines.append(f"{cost.lab:>8}" + "".join(f" {duration(seconds):>22}" for seconds in times)
                     + f"  {gradescope(cost)}")
    lines.append(f"{'all labs':>8}" + "".join(f" {duration(total):>22}" for total in totals))
    return lines


def gradescope(cost: LabCost) -> str:
    """The container a lab needs on Gradescope, and a submission's time there at least."""
    size = container(cost.peak_bytes)
    if size is None:
        return f"no container holds {MEMORY_MARGIN:g} x {cost.peak_bytes / GIB:.2f} GiB"
    cpus, gib = size
    return (f"{cpus:g} CPU, {memory_name(gib)}: "
            f">= {container_seconds(cost.wall, cost.cpu, cpus):.0f} s")


def duration(seconds: float) -> str:
    """Hours past an hour, else minutes."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"
