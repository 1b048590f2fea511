"""Sets of time intervals: their union, its length, the overlap of two, the difference.

An interval is a ``(start, end)`` pair (seconds); :func:`union` makes a list of them sorted and
disjoint, which is what :func:`overlap` and :func:`difference` take. The summary of a trace
(:mod:`reference_impl.perf.trace_summary`) and lab 6's reading of one
(:mod:`reference_impl.perf.trace_analysis`) are built from them.
"""
from __future__ import annotations

Intervals = list[tuple[float, float]]  # (start, end) in seconds


def union_length(intervals) -> float:
    """The time covered by ``intervals`` (any order, overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def union(intervals) -> list[tuple[float, float]]:
    """``intervals`` as a sorted list of disjoint intervals (overlapping ones joined)."""
    merged = []
    for start, stop in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def overlap(a, b) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def difference(a, b) -> list[tuple[float, float]]:
    """The parts of the sorted, disjoint intervals ``a`` outside the sorted, disjoint ``b``."""
    left = []
    for start, end in a:
        for cut_start, cut_end in b:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                left.append((start, cut_start))
            start = max(start, cut_end)
        if start < end:
            left.append((start, end))
    return left
