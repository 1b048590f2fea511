# Student file for the labs, generated from reference_impl/perf/trace_analysis.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Where a step's time goes, read from a merged trace: compute, communication, the part of the
communication that is exposed, and the scaling efficiency of a run.

The trace is the one :mod:`reference_impl.perf.traces` writes (``merge_traces``): one
process (``pid``) per rank, complete events ("X", ``ts`` and ``dur`` in microseconds) for the
named ranges, "attn forward" or "mlp backward" (compute) and "all_reduce" or
"batch_isend_irecv wait" (communication), on the thread (``tid``) that opened them.

The quantities are those of Holistic Trace Analysis (PyTorch's HTA, "Communication Computation
Overlap" and "Temporal Breakdown"), per rank:

* **communication**: the time in communication ranges (their union);
* **compute**: the time in compute ranges, less the communication *on the same thread*
  nested in them: a thread that called a blocking collective is waiting, not computing;
* **overlapped**: communication while compute runs (on another thread or stream: DDP's
  bucketed all-reduce during the backward, an NCCL kernel beside a GEMM);
* **exposed communication** = communication - overlapped: what the rank waits for, the part
  worth attacking first;
* **idle**: the rank's span (first range's start to last range's end) in neither.

A step is as slow as its slowest rank. Scaling efficiency compares N ranks with one: strong
scaling (the same problem) T1 / (N * TN), weak scaling (the problem grown N times) T1 / TN;
the course notes "Week 15 - Tensor Parallelism and Pipeline Parallelism", lab step 3.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.perf.intervals import Intervals, difference, overlap, union, union_length
from reference_impl.perf.traces import ranges_by_rank  # {rank: {thread: {"compute", "comm"}}}


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
    raise NotImplementedError("lab6: compute = each thread's compute ranges less the communication on that same thread (a blocking call is waiting), joined over threads; communication = every thread's comm ranges joined; overlapped = their intersection; exposed = comm - overlapped; idle = the span (first start to last end) in neither")


def breakdown(trace) -> list[RankTime]:
    """:class:`RankTime` of every rank of a trace, by rank."""
    return [rank_time(rank, threads) for rank, threads in sorted(ranges_by_rank(trace).items())]


def step_seconds(ranks: list[RankTime], steps: int) -> float:
    """Seconds per step of a trace of ``steps`` steps, from its ranks' :class:`RankTime`."""
    raise NotImplementedError('lab6: a step is as slow as its slowest rank: the longest span, per step')


def scaling_efficiency(t1: float, tn: float, n: int, weak: bool = False) -> float:
    """Efficiency of N ranks against one, from their times per step (see the module
    docstring)."""
    if n < 1 or t1 <= 0 or tn <= 0:
        raise ValueError(f"scaling efficiency needs n >= 1 and positive times, got n = {n}, "
                         f"T1 = {t1}, TN = {tn}")
    raise NotImplementedError('lab6: strong scaling: ideal TN is T1 / N, so T1 / (N TN); weak: ideal TN is T1, so T1 / TN')
