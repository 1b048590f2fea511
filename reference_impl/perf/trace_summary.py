"""Time in compute vs communication per rank of a trace, as a table.

    print(summarize("merged.json"))

:func:`summarize` reads the ranges of :func:`reference_impl.perf.ranges.profiled` from a trace
(:func:`reference_impl.perf.traces.ranges_by_rank`) and gives, per rank, the time in compute and
in communication (lab 6's reading of them: :func:`reference_impl.perf.trace_analysis.rank_time`;
of which in a ``wait()``), the calls and the communication's share. On a GPU it is the host's
view; what that means, and the GPU's: ``docs/profiling.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.perf.intervals import union_length
from reference_impl.perf.ranges import WAIT_SUFFIX, range_kind
from reference_impl.perf.trace_analysis import rank_time  # lab 6: compute and communication
from reference_impl.perf.traces import event_interval, load_trace, range_events, ranges_by_rank


@dataclass(frozen=True)
class RankSummary:
    rank: int
    compute_s: float   # the forward/backward ranges (their union) minus the comm inside them
    #                    on the same thread
    comm_s: float      # the collective/send/recv ranges (their union)
    wait_s: float      # of which in a wait(): a pipeline stage idle (bubble), or a step
    #                    waiting for its async collectives
    comm_calls: dict   # range name -> how many
    comm_fraction: float  # comm / (compute + comm)


class SummaryTable(list):
    """A list of :class:`RankSummary`, one per rank; prints as a table."""

    def __str__(self) -> str:
        lines = [f"{'rank':>4}  {'compute (ms)':>12}  {'comm (ms)':>9}  {'of which wait':>13}  "
                 f"{'comm share':>10}  comm calls"]
        for row in self:
            calls = ", ".join(f"{name} x{count}" for name, count in sorted(row.comm_calls.items()))
            lines.append(f"{row.rank:>4}  {1e3 * row.compute_s:>12.2f}  {1e3 * row.comm_s:>9.2f}"
                         f"  {1e3 * row.wait_s:>13.2f}  {row.comm_fraction:>10.0%}  {calls}")
        return "\n".join(lines)

    _repr_pretty_ = lambda self, printer, cycle: printer.text(str(self))  # noqa: E731


def summarize(trace) -> SummaryTable:
    """Time in compute vs communication per rank (process) of a trace (a merged one, or one
    rank's; a path, dict or list of events). Communication: the union of the collective and
    send/recv ranges (the time in flight of async collectives included); compute: the union of
    the forward/backward ranges minus the communication inside them on the same thread (a
    thread in a blocking collective waits; a collective in flight on another row does not stop
    it; nested module ranges are counted once)."""
    trace = load_trace(trace)
    per_rank = ranges_by_rank(trace)  # pid -> tid -> {"compute": intervals, "comm": intervals}
    waits: dict = {}
    calls: dict[int, dict[str, int]] = {}
    for event in range_events(trace):
        pid = event.get("pid", 0)
        if event["name"].endswith(WAIT_SUFFIX):
            waits.setdefault(pid, []).append(event_interval(event))
        if range_kind(event["name"]) == "comm":
            counter = calls.setdefault(pid, {})
            counter[event["name"]] = counter.get(event["name"], 0) + 1
    table = SummaryTable()
    for index, pid in enumerate(sorted(per_rank, key=lambda p: (not isinstance(p, int), p))):
        time = rank_time(pid, per_rank[pid])
        compute_s, comm_s = time.compute_s, time.comm_s
        rank = pid if isinstance(pid, int) and len(per_rank) > 1 else index
        total = comm_s + compute_s
        wait_s = union_length(waits.get(pid, []))
        table.append(RankSummary(rank, compute_s, comm_s, wait_s, calls.get(pid, {}),
                                 comm_s / total if total else 0.0))
    return table
