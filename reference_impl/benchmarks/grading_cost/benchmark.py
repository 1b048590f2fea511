"""The benchmark: every lab graded and measured, the launches timed apart, then the tables
printed (and the measurements written as JSON with ``--out``)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

from reference_impl.benchmarks import grading_cost
from reference_impl.benchmarks.grading_cost.estimates import CLASS_SIZE, GIB, breakdown
from reference_impl.benchmarks.grading_cost.labs import LabCost, grade_lab, solved_class
from reference_impl.benchmarks.grading_cost.launches import calibrate
from reference_impl.benchmarks.grading_cost.tables import class_table, cost_table
from reference_impl.course.grade.gradescope.containers import MEMORY_MARGIN

COMMAND = "python -m reference_impl.course.grade SUBMISSIONS --labs N --jobs 1"


@dataclass
class Measurements:
    machine: dict
    costs: list[LabCost]
    calibration: dict  # launches.time_launches's
    load: tuple[float, float]  # the 1-minute load average before and after


def machine() -> dict:
    """The machine the figures were measured on."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo
                  if line.startswith("model name")), platform.processor() or "?")
    memory = next((int(line.split()[1]) * 1024 for line in meminfo
                   if line.startswith("MemTotal")), 0)
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(memory / GIB, 1),
            "torch": version("torch"), "python": platform.python_version()}


def measure(labs: list[str], select: str | None = None, sandbox: str | None = None,
            memory: str = "auto", progress=print) -> Measurements:
    """Grade each of ``labs`` (``"lab7"``) on the solved submission, then time the sandbox
    probe and empty launches of the sizes they used."""
    costs, load_before = [], os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="grading-cost-") as folder:
        submissions = solved_class(Path(folder))
        for lab in labs:
            cost = grade_lab(lab, submissions, Path(folder) / f"results-{lab}", select, sandbox,
                             memory)
            progress(f"{lab}: {cost.passed}/{cost.tests} passed in {cost.wall:.1f} s "
                     f"(load {cost.load_before:.2f} -> {cost.load_after:.2f})")
            costs.append(cost)
    sizes = sorted({size for cost in costs for size in cost.launches} or {1})
    calibration = calibrate(sizes)
    return Measurements(machine(), costs, calibration, (load_before, os.getloadavg()[0]))


def report(measured: Measurements) -> str:
    box, calibration = measured.machine, measured.calibration
    launches = ", ".join(f"{size} rank{'s' * (size > 1)} {seconds:.3f} s"
                         for size, seconds in sorted(calibration["launch"].items()))
    method = measured.costs[0].memory_method if measured.costs else "?"
    kind = "sandboxed " if calibration["sandboxed"] else ""
    return "\n".join([
        f"machine: {box['cpus']} CPUs ({box['cpu_model']}), {box['memory_gib']} GiB, "
        f"torch {box['torch']}, Python {box['python']}",
        f"one solved submission, each lab graded by `{COMMAND}`:", "",
        *cost_table(measured.costs, calibration), "",
        f"peak: the whole tree, ranks included ({method}). start: the grader's and pytest's "
        f"interpreters, torch, pytest, the collection (the grader's imports alone: "
        f"{calibration['imports']:.1f} s); servers: the rank servers, the grader's sandbox probe "
        f"({calibration['probe']:.1f} s, timed apart) and pytest's; launches: counted in the "
        f"grading log, each as long as an empty {kind}launch ({launches}); checks: the tests' "
        "time less their launches; rest: results written, processes ended.", "",
        f"a class of {CLASS_SIZE}, lab by lab, from the CPU-rank figures above (on GPUs: "
        f"unmeasured); Gradescope: the smallest container with {MEMORY_MARGIN:g} x the peak, "
        "and a submission's time there, at least its wall time here or its CPU time over the "
        "container's CPUs:", "", *class_table(measured.costs)])


def as_json(measured: Measurements) -> dict:
    return {"machine": measured.machine, "calibration": measured.calibration,
            "load_average_1m": {"before": measured.load[0], "after": measured.load[1]},
            "labs": [{**asdict(cost), "breakdown": breakdown(cost, measured.calibration)}
                     for cost in measured.costs]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.benchmarks.grading_cost",
                                     description=grading_cost.__doc__.splitlines()[0])
    parser.add_argument("--labs", default=None, help="e.g. 0,1 (default: every lab)")
    parser.add_argument("--out", type=Path, default=None, help="the measurements, as JSON")
    parser.add_argument("-k", default=None, help="only the tests the grader's -k selects")
    parser.add_argument("--sandbox", default=None, choices=("auto", "namespaces", "none"),
                        help="the grader's --sandbox (default: its own default)")
    args = parser.parse_args(argv)
    from reference_impl.course import syllabus
    labs = ([f"lab{lab.removeprefix('lab')}" for lab in args.labs.split(",")] if args.labs
            else list(syllabus.markers()))
    measured = measure(labs, args.k, args.sandbox,
                       progress=lambda line: print(line, flush=True))
    print(f"\nload average (1 min): {measured.load[0]:.2f} before, {measured.load[1]:.2f} after")
    print(report(measured))
    if args.out is not None:
        args.out.write_text(json.dumps(as_json(measured), indent=2) + "\n")
        print(f"\nwrote {args.out}")
    return 0
