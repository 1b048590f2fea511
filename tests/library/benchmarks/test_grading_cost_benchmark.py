"""The grading-cost benchmark (``python -m reference_impl.benchmarks.grading_cost``): one lab
graded on one selected test by the batch grader's command, its table's columns and positive
numbers, a tree's peak above the largest single process's, the RSS sampling where no cgroup is
used, and the arithmetic of the estimates on given inputs. Times are never asserted."""
import re
import sys

import pytest

from reference_impl.benchmarks.grading_cost import estimates, tables, tree
from reference_impl.benchmarks.grading_cost.benchmark import as_json, measure, report
from reference_impl.benchmarks.grading_cost.labs import LabCost
from reference_impl.course.grade.gradescope import containers
from reference_impl.course.sandboxing import probe

GIB = 1 << 30


def lab_cost(**overrides) -> LabCost:
    fields = dict(lab="lab7", tests=14, passed=14, wall=25.0, cpu=30.0, peak_bytes=GIB,
                  memory_method="cgroup v1 max_usage", largest_process_bytes=GIB // 2,
                  grader_start=7.0, pytest_start=4.0, pytest_probe=2.0, tests_seconds=10.0,
                  submission_seconds=16.0, exit_seconds=1.0, launches={1: 10, 4: 5},
                  load_before=0.1, load_after=0.2)
    return LabCost(**{**fields, **overrides})


CALIBRATION = {"imports": 3.0, "probe": 2.5, "sandboxed": True, "launch": {1: 0.1, 4: 0.2}}


@pytest.mark.slow  # grades one test of lab 7 end to end: about 20 s on two cores
def test_one_lab_is_measured_and_tabled():
    measured = measure(["lab7"], select="llama", progress=lambda line: None,
                       sandbox=None if probe() is None else "none")
    (cost,) = measured.costs
    assert (cost.tests, cost.passed, cost.launches) == (1, 1, {1: 1})
    assert cost.wall > 0 and cost.cpu > 0 and cost.submission_seconds > 0
    assert cost.peak_bytes > cost.largest_process_bytes > 0  # more than its largest process
    header, row = tables.cost_table(measured.costs, measured.calibration)
    assert header.split() == " ".join(tables.COST_COLUMNS).split()
    cells = dict(zip(("lab", "tests", "wall", "cpu", "peak", "start", "servers"), row.split()))
    assert cells["lab"] == "lab7" and cells["tests"] == "1"
    assert all(float(cells[name]) > 0 for name in ("wall", "cpu", "peak", "start", "servers"))
    assert re.search(r" 1 x 0\.\d{3} ", row), row
    printed = report(measured)
    assert f"torch {measured.machine['torch']}" in printed and "a class of 200" in printed
    assert set(as_json(measured)["labs"][0]["breakdown"]) == {
        "start", "rank servers", "launches", "checks", "rest"}


def test_the_sampled_peak_sums_the_tree():
    """Without a cgroup: two processes holding 200 MB of their own each are summed, and the CPU
    time of a child that outlives its parent is still counted (the meter reaps it)."""
    code = ("import os, time\nblock = b'1' * (200 << 20)\nif os.fork() == 0:\n"
            "    child = b'2' * (200 << 20)\n    time.sleep(1.0)\n    end = time.time() + 0.3\n"
            "    while time.time() < end:\n        pass\n    os._exit(0)\ntime.sleep(0.5)\n")
    run = tree.run_measured([sys.executable, "-c", code], memory="sampled")
    assert run.returncode == 0 and run.memory_method == tree.SAMPLED
    assert run.peak_bytes > 400 << 20
    assert run.cpu >= 0.25
    assert run.wall >= 1.3


def test_breakdown_adds_up_to_the_wall_time():
    parts = estimates.breakdown(lab_cost(), CALIBRATION)
    assert parts["launches"] == pytest.approx(10 * 0.1 + 5 * 0.2)
    assert parts["start"] == pytest.approx(7.0 - 2.5 + 4.0)
    assert parts["rank servers"] == pytest.approx(2.5 + 2.0)
    assert parts["checks"] == pytest.approx(10.0 - 2.0)
    assert sum(parts.values()) == pytest.approx(25.0)


def test_a_class_is_one_start_then_its_rounds():
    one, server, array = estimates.SETUPS
    assert estimates.per_run_seconds(lab_cost()) == 9.0
    assert estimates.class_seconds(9.0, 16.0, 200, one) == 9.0 + 200 * 16.0
    assert estimates.class_seconds(9.0, 16.0, 200, server) == 9.0 + 100 * 16.0
    assert estimates.class_seconds(9.0, 16.0, 200, array) == 9.0 + 10 * 16.0
    assert estimates.class_seconds(9.0, 16.0, 201, array) == 9.0 + 11 * 16.0


def test_the_gradescope_container_holds_one_and_a_half_times_the_peak():
    assert containers.container(400 << 20) == (0.5, 0.75)  # 600 MiB in 768 MB
    assert containers.container(600 << 20) == (1.0, 1.5)  # 900 MiB
    assert containers.container(GIB) == (1.0, 1.5)
    assert containers.container(GIB + 1) == (2.0, 3.0)
    assert containers.container(5 * GIB) is None
    assert containers.container_seconds(wall=20.0, cpu=30.0, cpus=0.5) == 60.0
    assert containers.container_seconds(wall=20.0, cpu=30.0, cpus=2.0) == 20.0
    assert tables.memory_name(0.75) == "768 MB" and tables.memory_name(1.5) == "1.5 GB"
