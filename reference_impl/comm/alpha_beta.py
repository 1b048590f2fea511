"""The alpha-beta cost model of communication, how to fit it to measurements, and which
all-reduce it picks.

A message of S bytes costs alpha + S/B; a ring all-reduce over n ranks (``collectives.py``)
costs 2(n-1) alpha + 2(n-1)/n S/B, recursive doubling log2(n) (alpha + S/B). Measured times
fitted to a line give alpha (intercept) and B (slope), and the two models then say where the
algorithms cross, as MPICH picks its all-reduce (Thakur, Rabenseifner and Gropp 2005,
"Optimization of collective communication operations in MPICH"). The derivations: lab 0's
notebook, sections "4. What does an all-reduce cost? The alpha-beta model" and "5. Ring or
recursive doubling? Let the model choose".
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device, wait_for_device


def ring_all_reduce_seconds(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Predicted time of a ring all-reduce of ``nbytes`` over ``n`` ranks."""
    # BEGIN SOLUTION lab0: ring_all_reduce_seconds (hint: "the ring cost and the fit" in the notebook)
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth
    # END SOLUTION


def fit_line(x: list[float], y: list[float]) -> tuple[float, float]:
    """The least-squares line through the points (x, y): (intercept, slope)."""
    if len(set(x)) < 2:
        raise ValueError(f"a line needs points at two different sizes at least, got the sizes "
                         f"{sorted(set(x))}")
    # BEGIN SOLUTION lab0: fit_line (hint: "the ring cost and the fit" in the notebook)
    x, y = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    centred = x - x.mean()
    slope = (centred * (y - y.mean())).sum() / (centred * centred).sum()
    return (y.mean() - slope * x.mean()).item(), slope.item()
    # END SOLUTION


def fit_alpha_beta(nbytes: list[float], seconds: list[float], n: int) -> tuple[float, float]:
    """Least-squares fit of measured ring all-reduce times; returns (alpha in s, bandwidth in B/s)."""
    # BEGIN SOLUTION lab0: fit_alpha_beta (hint: "the ring cost and the fit" in the notebook)
    intercept, slope = fit_line(nbytes, seconds)
    return intercept / (2 * (n - 1)), 2 * (n - 1) / (n * slope)
    # END SOLUTION


def _power_of_two(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(f"recursive doubling runs on a power-of-two number of ranks, got n={n}")


def recursive_doubling_seconds(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Predicted time of a recursive-doubling all-reduce of ``nbytes`` over ``n`` = 2^k ranks."""
    _power_of_two(n)
    # BEGIN SOLUTION lab0: recursive_doubling_seconds (hint: "ring or recursive doubling" in the notebook)
    return math.log2(n) * (alpha + nbytes / bandwidth)
    # END SOLUTION


def crossover_bytes(n: int, alpha: float, bandwidth: float) -> float:
    """The message size at which the ring and recursive doubling over ``n`` = 2^k ranks take
    the same time: recursive doubling is faster below it, the ring above; ``math.inf`` where
    the ring is never the faster."""
    _power_of_two(n)
    # BEGIN SOLUTION lab0: crossover_bytes (hint: "ring or recursive doubling" in the notebook)
    steps = math.log2(n)
    extra_per_byte = steps - 2 * (n - 1) / n  # recursive doubling's bytes beyond the ring's, per byte of S
    if extra_per_byte <= 0:
        return math.inf
    return (2 * (n - 1) - steps) * alpha * bandwidth / extra_per_byte
    # END SOLUTION


def faster_all_reduce(nbytes: float, n: int, alpha: float, bandwidth: float) -> str:
    """"ring" or "recursive doubling": the faster all-reduce of ``nbytes`` over ``n`` ranks by
    the model; the ring where recursive doubling cannot run (n not a power of two) and on a tie."""
    # BEGIN SOLUTION lab0: faster_all_reduce (hint: "ring or recursive doubling" in the notebook)
    if n & (n - 1) or n == 1:
        return "ring"
    return "recursive doubling" if nbytes < crossover_bytes(n, alpha, bandwidth) else "ring"
    # END SOLUTION


def all_reduce_plan(nbytes: list[float], seconds: list[float], n: int) -> list[str]:
    """The faster all-reduce at each of the sizes ``nbytes`` on ``n`` ranks, by the model fitted
    to the ring all-reduce times ``seconds`` measured at those sizes."""
    # BEGIN SOLUTION lab0: all_reduce_plan (hint: "ring or recursive doubling" in the notebook)
    alpha, bandwidth = fit_alpha_beta(nbytes, seconds, n)
    return [faster_all_reduce(size, n, alpha, bandwidth) for size in nbytes]
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
