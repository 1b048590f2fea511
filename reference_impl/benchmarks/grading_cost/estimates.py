"""The arithmetic from the measured labs: where a lab's wall time went, a class graded on a
setup of machines, and the Gradescope container a lab needs."""
from __future__ import annotations

import math
from dataclasses import dataclass

from reference_impl.benchmarks.grading_cost.labs import LabCost

GIB = 1 << 30
CLASS_SIZE = 200


@dataclass(frozen=True)
class Setup:
    """Where a class is graded: ``machines`` grader commands, each on its share of the class,
    ``jobs`` submissions at once on each."""
    name: str
    machines: int
    jobs: int


SETUPS = (Setup("one 2-core machine", 1, 1),
          Setup("one 8-GPU server", 1, 2),  # --jobs 2, 4 GPUs each
          Setup("10 servers, job array", 10, 2))


def launch_seconds(launches: dict[int, int], seconds_per_launch: dict[int, float]) -> float:
    """The launches' share of the tests' time: each launch as long as an empty one its size."""
    return sum(count * seconds_per_launch[size] for size, count in launches.items())


def breakdown(cost: LabCost, calibration: dict) -> dict[str, float]:
    """Where a lab's wall time went, in seconds: ``start`` (the grader's and pytest's
    interpreters, torch, pytest and the collection), ``rank servers`` (the grader's sandbox
    probe, timed apart, and pytest's, which starts the ranks' server), ``launches``,
    ``checks`` (the tests' time less their launches) and ``rest`` (results written, processes
    ended). They add up to the wall time."""
    probe = min(calibration["probe"], cost.grader_start)
    launches = launch_seconds(cost.launches, calibration["launch"])
    parts = {"start": cost.grader_start - probe + cost.pytest_start,
             "rank servers": probe + cost.pytest_probe, "launches": launches,
             "checks": cost.tests_seconds - launches}
    parts["rest"] = cost.wall - sum(parts.values())
    return parts


def per_run_seconds(cost: LabCost) -> float:
    """What a grader command pays once, whatever the class: its start and its end."""
    return max(0.0, cost.wall - cost.submission_seconds)


def class_seconds(per_run: float, per_submission: float, students: int, setup: Setup) -> float:
    """A class graded on ``setup``: each machine's command starts once, then grades its share
    of the class ``setup.jobs`` at a time; the busiest machine's rounds decide."""
    return per_run + math.ceil(students / (setup.machines * setup.jobs)) * per_submission
