"""Simulate a pipeline schedule: when each pass starts and ends, the bubble, the memory held.

:func:`simulate` plays a schedule with per-microbatch pass costs (``cost_f``, the whole backward
``cost_b``, ``cost_w`` for a split one, 1/v each per chunk); :func:`makespan_formula` and
:func:`bubble_formula` are the closed forms of GPipe, 1F1B, interleaved 1F1B (Narayanan et al.
2021) and ZB-H1 (Qi et al. 2023), which it gives exactly within their ranges. A
:class:`Timeline` can also hold measured times. The cost model and the formulas:
docs/library.md, 'Validating, simulating, splitting the backward'.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.pipeline.pipeline_messages import normalized
from reference_impl.pipeline.pipeline_schedules import Action, Schedule
from reference_impl.pipeline.pipeline_validator import validate


@dataclass(frozen=True)
class TimedAction:
    """One pass as it ran (or would run): on ``rank`` from ``start`` to ``end``."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """The passes of a schedule with their times, simulated (cost units) or measured ("s")."""

    schedule: Schedule
    events: tuple[TimedAction, ...]
    unit: str = "cost"  # "cost" for simulated times, "s" for seconds measured by an executor

    def on_rank(self, rank: int) -> tuple[TimedAction, ...]:
        """``rank``'s passes in the order they started."""
        return tuple(sorted((e for e in self.events if e.rank == rank), key=lambda e: e.start))

    @property
    def start(self) -> float:
        return min(event.start for event in self.events)

    @property
    def makespan(self) -> float:
        """From the first pass's start to the last pass's end."""
        return max(event.end for event in self.events) - self.start

    def busy(self, rank: int) -> float:
        return sum(event.end - event.start for event in self.events if event.rank == rank)

    @property
    def bubble_fraction(self) -> float:
        """Idle time over p * makespan: the share of the ranks' time spent waiting."""
        p = self.schedule.ranks
        total = p * self.makespan
        if total == 0:  # every pass took no time: nobody waited either
            return 0.0
        return (total - sum(self.busy(rank) for rank in range(p))) / total

    @property
    def peak_in_flight(self) -> tuple[int, ...]:
        """Per rank, the most forward passes whose activations were still held: until the B,
        or until the W when the backward is split (B keeps each weight's inputs and output
        gradients for W, as the zero-bubble paper's ZB-H1 does).

        With v = 1 this counts microbatches; with v > 1 chunks the unit is one chunk's
        activations (1/v of the rank's layers).
        """
        release = "W" if self.schedule.split_backward else "B"
        peaks = []
        for rank in range(self.schedule.ranks):
            held = peak = 0
            for event in self.on_rank(rank):
                held += {"F": 1, release: -1}.get(event.action.kind, 0)
                peak = max(peak, held)
            peaks.append(peak)
        return tuple(peaks)


def simulate(schedule: Schedule, cost_f: float = 1.0, cost_b: float = 2.0,
             cost_w: float | None = None, comm: float = 0.0) -> Timeline:
    """The timeline of ``schedule`` (validated first) with the given pass costs (see module)."""
    validate(schedule)
    schedule = normalized(schedule)
    if cost_w is None:
        cost_w = cost_b / 2
    for name, value in (("cost_f", cost_f), ("cost_b", cost_b), ("cost_w", cost_w),
                        ("comm", comm)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if cost_w > cost_b:
        raise ValueError(f"cost_w ({cost_w}) is part of the backward, so it cannot exceed "
                         f"cost_b ({cost_b})")
    v = schedule.chunks
    if schedule.split_backward:
        cost = {"F": cost_f / v, "B": (cost_b - cost_w) / v, "W": cost_w / v}
    else:
        cost = {"F": cost_f / v, "B": cost_b / v}

    end: dict[Action, float] = {}  # finished passes

    def arrival(kind: str, microbatch: int, stage: int, rank: int) -> float | None:
        """When the output of a pass reaches ``rank``; None if it has not run yet."""
        producer = Action(kind, microbatch, stage)
        if producer not in end:
            return None
        return end[producer] + (0.0 if schedule.rank_of(stage) == rank else comm)

    def ready(action: Action, rank: int) -> float | None:
        kind, mb, s = action.kind, action.microbatch, action.stage
        if kind == "F":
            return 0.0 if s == 0 else arrival("F", mb, s - 1, rank)
        if kind == "B":
            own_forward = end[Action("F", mb, s)]
            if s == schedule.stages - 1:
                return own_forward
            gradient = arrival("B", mb, s + 1, rank)
            return None if gradient is None else max(own_forward, gradient)
        return end[Action("B", mb, s)]

    events = []
    free = [0.0] * schedule.ranks  # when each rank finishes its current pass
    position = [0] * schedule.ranks
    moved = True
    while moved:  # the schedule is deadlock-free, so this ends with every pass placed
        moved = False
        for rank, ops in enumerate(schedule.actions):
            while position[rank] < len(ops):
                action = ops[position[rank]]
                input_time = ready(action, rank)
                if input_time is None:
                    break
                start = max(free[rank], input_time)
                free[rank] = end[action] = start + cost[action.kind]
                events.append(TimedAction(rank, action, start, end[action]))
                position[rank] += 1
                moved = True
    events.sort(key=lambda e: (e.rank, e.start))
    return Timeline(schedule, tuple(events))


def makespan_formula(name: str, p: int, m: int, v: int = 1, cost_f: float = 1.0,
                     cost_b: float = 2.0, cost_w: float | None = None) -> float:
    """The closed-form makespan of schedule ``name`` (docs/library.md), comm = 0."""
    if cost_w is None:
        cost_w = cost_b / 2
    if name in ("naive", "gpipe", "1f1b"):
        return (m + p - 1) * (cost_f + cost_b)
    if name == "interleaved":
        return (m + (p - 1) / v) * (cost_f + cost_b)
    if name == "zb-h1":
        t_b, t_w = cost_b - cost_w, cost_w
        return m * (cost_f + t_b + t_w) + (p - 1) * (cost_f + t_b - t_w)
    raise ValueError(f"no closed form for schedule {name!r}; "
                     f"choose one of naive, gpipe, 1f1b, interleaved, zb-h1")


def bubble_formula(name: str, p: int, m: int, v: int = 1, cost_f: float = 1.0,
                   cost_b: float = 2.0, cost_w: float | None = None) -> float:
    """The closed-form bubble fraction, 1 - m(T_F + T_B + T_W) / makespan.

    For GPipe and 1F1B this is (p-1)/(m+p-1) and for interleaved (p-1)/(v*m+p-1), whatever
    the costs; for ZB-H1 it depends on them.
    """
    makespan = makespan_formula(name, p, m, v, cost_f, cost_b, cost_w)
    return 1 - m * (cost_f + cost_b) / makespan
