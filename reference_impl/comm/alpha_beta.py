"""The alpha-beta cost model of communication, and how to fit it to measurements.

A message of S bytes costs alpha + S/B: a fixed latency alpha plus the bytes over the
bandwidth B. A ring all-reduce over n ranks (``collectives.py``) takes 2(n-1) steps, each
moving S/n bytes, so

    T_all_reduce(S, n) = 2(n-1) * alpha + 2(n-1)/n * S / B

Measured times of all-reduce over several sizes lie on a line T = a + b*S; the fitted
intercept and slope give alpha = a / (2(n-1)) and B = 2(n-1) / (n*b).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device, wait_for_device


def ring_all_reduce_seconds(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Predicted time of a ring all-reduce of ``nbytes`` over ``n`` ranks."""
    # BEGIN SOLUTION lab0: the alpha-beta time of a ring all-reduce, 2(n-1)*alpha + 2(n-1)/n * S/B
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth
    # END SOLUTION


def fit_alpha_beta(nbytes: list[float], seconds: list[float], n: int) -> tuple[float, float]:
    """Least-squares fit of measured all-reduce times; returns (alpha in s, bandwidth in B/s)."""
    # BEGIN SOLUTION lab0: fit the line seconds = a + b*nbytes by least squares, then alpha = a/(2(n-1)) and bandwidth = 2(n-1)/(n*b)
    x, y = torch.tensor(nbytes, dtype=torch.float64), torch.tensor(seconds, dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], dim=1)
    intercept, slope = torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1).tolist()
    return intercept / (2 * (n - 1)), 2 * (n - 1) / (n * slope)
    # END SOLUTION


def time_all_reduce(nbytes: list[int], repeats: int = 5, group=None) -> list[float]:
    """Median seconds of ``dist.all_reduce`` for each message size (float32), on every rank."""
    device = current_device()
    medians = []
    for size in nbytes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        dist.all_reduce(tensor, group=group)  # warm-up: connections, allocations
        times = []
        for _ in range(repeats):
            wait_for_device()
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            wait_for_device()
            times.append(time.perf_counter() - start)
        # The slowest rank sets the time of a collective.
        slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        medians.append(slowest.item())
    return medians
