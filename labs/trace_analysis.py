# Student file for the labs, generated from reference_impl/perf/trace_analysis.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Where a step's time goes, read from a merged trace: compute, communication, the part of the
communication that is exposed, and the scaling efficiency of a run.

The trace is :mod:`reference_impl.perf.traces`' (``merge_traces``): one process (``pid``) per
rank, complete events ("X", ``ts`` and ``dur`` in microseconds) for named compute ranges ("attn
forward") and communication ranges ("all_reduce"), on the thread (``tid``) that opened them.
Per rank, the quantities of Holistic Trace Analysis (PyTorch's HTA): communication, compute
(less the communication nested in it on the same thread), overlapped, exposed communication
and idle; strong and weak scaling efficiency (the course notes "Week 15 - Tensor Parallelism
and Pipeline Parallelism", lab step 3); and, for ranks on different clocks, the offsets read
from the shared ends of blocking collectives, one aligned timeline and the straggler.

Lab 6's notebook, "3. Exposed communication, read from the trace", "5. Scaling efficiency" and
"6. Clocks that disagree: one timeline, and the straggler".
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from reference_impl.perf.intervals import Intervals, difference, overlap, union, union_length
from reference_impl.perf.traces import event_interval, range_events
from reference_impl.perf.traces import ranges_by_rank  # {rank: {thread: {"compute", "comm"}}}

ANCHOR = "all_reduce"  # the collective whose ends line the clocks up: a blocking one


@dataclass(frozen=True)
class RankTime:
    rank: int
    compute_s: float
    comm_s: float
    overlapped_s: float    # communication while this rank computes
    exposed_comm_s: float  # comm_s - overlapped_s
    idle_s: float          # span_s in neither compute nor communication
    span_s: float          # the first range's start to the last range's end


def rank_time(rank: int, threads: dict[int, dict[str, Intervals]]) -> RankTime:
    """One rank's time, from its ranges by thread (:func:`ranges_by_rank`), as the module
    docstring defines it. Interval helpers: ``union`` (sorted, disjoint), ``union_length``,
    ``overlap`` (length of the intersection of two unions), :func:`difference`."""
    raise NotImplementedError('lab6: rank_time (hint: "the time of a rank" in the notebook)')


def breakdown(trace) -> list[RankTime]:
    """:class:`RankTime` of every rank of a trace, by rank."""
    return [rank_time(rank, threads) for rank, threads in sorted(ranges_by_rank(trace).items())]


def step_seconds(ranks: list[RankTime], steps: int) -> float:
    """Seconds per step of a trace of ``steps`` steps, from its ranks' :class:`RankTime`."""
    raise NotImplementedError('lab6: step_seconds (hint: "step time and efficiency" in the notebook)')


def scaling_efficiency(t1: float, tn: float, n: int, weak: bool = False) -> float:
    """Efficiency of N ranks against one, from their times per step (see the module
    docstring)."""
    if n < 1 or t1 <= 0 or tn <= 0:
        raise ValueError(f"scaling efficiency needs n >= 1 and positive times, got n = {n}, "
                         f"T1 = {t1}, TN = {tn}")
    raise NotImplementedError('lab6: scaling_efficiency (hint: "step time and efficiency" in the notebook)')


# ------------------------------------------------------------------------ per-rank clocks

def anchor_intervals(trace, anchor: str = ANCHOR) -> dict[int, Intervals]:
    """{process: its ranges named exactly ``anchor``, as (start, end) in seconds, in the
    order the trace lists them} of a trace (a path, dict or list of events)."""
    found: dict[int, Intervals] = {}
    for event in range_events(trace):
        if event["name"] == anchor:
            found.setdefault(event.get("pid", 0), []).append(event_interval(event))
    return found


def clock_offsets(traces: dict, anchor: str = ANCHOR) -> dict[int, float]:
    """{rank: seconds to add to its timestamps to put them on the lowest rank's clock}, from
    ``traces`` = {rank: that rank's own trace (path, dict or events)}, given in any order.
    The k-th ``anchor`` collective ends at the same instant on every rank (module docstring);
    one late or early end must not move an offset. A rank without the anchor, or with another
    number of them than the lowest rank, is refused (ValueError naming both)."""
    if not traces:
        raise ValueError("clock_offsets needs at least one rank's trace, got none")
    raise NotImplementedError('lab6: clock_offsets (hint: "one timeline and the straggler" in the notebook)')


def aligned_timeline(traces: dict, anchor: str = ANCHOR) -> dict:
    """One trace of ``traces`` ({rank: its own trace}): every rank's range events moved to
    process ``rank`` and shifted onto the lowest rank's clock (:func:`clock_offsets`; ``ts``
    in microseconds), sorted by start time."""
    raise NotImplementedError('lab6: aligned_timeline (hint: "one timeline and the straggler" in the notebook)')


def arrival_waits(timeline, anchor: str = ANCHOR) -> dict[int, float]:
    """{rank: seconds it spent in the ``anchor`` collectives waiting for the last rank to
    join}, over every ``anchor`` collective of one aligned timeline. Ranks with different
    numbers of them are refused (ValueError naming the counts); a timeline without the anchor
    gives {}."""
    raise NotImplementedError('lab6: arrival_waits (hint: "one timeline and the straggler" in the notebook)')


def straggler(waits: dict[int, float]) -> int:
    """The rank the others wait for, read from :func:`arrival_waits` (the lowest such rank on
    a tie)."""
    if not waits:
        raise ValueError("straggler needs the waits of at least one rank, got none")
    raise NotImplementedError('lab6: straggler (hint: "one timeline and the straggler" in the notebook)')
