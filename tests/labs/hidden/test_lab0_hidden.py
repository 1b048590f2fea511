"""Lab 0, hidden: the public checks on other seeds, lengths, group sizes and model parameters.

The sweeps draw other cases and permuted layouts (another seed) with longer tensors; the ring's
phases run on lengths and world sizes of their own; the alpha-beta checks get parameters drawn
here. Their expected values come from the model as this file writes it (this file never ships,
so it may): like every graded check, it never uses the lab's reference, which is a stub where
the graded labs are withheld (the Gradescope autograder's kit).
"""
import math
import random

import pytest
import torch

from test_lab0_collectives import (DOUBLING, RING, check_all_gather, check_choices,
                                   check_chunk_lengths, check_crossovers, check_fits, check_models,
                                   check_plans, check_reduce_scatter, check_sweep)
from reference_impl.course.contracts import assert_contract
from test_lab0_contracts import CHUNKS, FIT, PLAN, chunk_draws, measurement_draws

pytestmark = pytest.mark.lab0
CONTRACT_SEED = 104729  # added to the sweep's seed: the contracts' other draws

SEED_OFFSET = 7919  # the hidden sweeps' seeds: the public one plus this


def lengths(numel: int, n: int) -> list[int]:
    """The ring's chunks: as even as can be, the longer first."""
    return [numel // n + (rank < numel % n) for rank in range(n)]


def ring(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    return 2 * (n - 1) * (alpha + nbytes / (n * bandwidth))


def doubling(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    return math.log2(n) * (alpha + nbytes / bandwidth)


def crossover(n: int, alpha: float, bandwidth: float) -> float:
    """The size where the two times are equal (``inf`` where doubling never costs more)."""
    gap_per_byte = (doubling(1.0, n, 0.0, bandwidth) - ring(1.0, n, 0.0, bandwidth))
    if gap_per_byte <= 0:
        return math.inf
    return (ring(0.0, n, alpha, bandwidth) - doubling(0.0, n, alpha, bandwidth)) / gap_per_byte


def faster(nbytes: float, n: int, alpha: float, bandwidth: float) -> str:
    if n == 1 or n & (n - 1):
        return "ring"
    return "recursive doubling" if nbytes < crossover(n, alpha, bandwidth) else "ring"


def least_squares(x: list[float], y: list[float]) -> tuple[float, float]:
    """(intercept, slope), solved as a least-squares system."""
    design = torch.tensor([[1.0, value] for value in x], dtype=torch.float64)
    solution = torch.linalg.lstsq(design, torch.tensor(y, dtype=torch.float64)[:, None]).solution
    return solution[0, 0].item(), solution[1, 0].item()


def fitted(nbytes: list[float], seconds: list[float], n: int) -> tuple[float, float]:
    """(alpha, bandwidth) from the ring's line: intercept 2(n-1) alpha, slope 2(n-1)/(nB)."""
    intercept, slope = least_squares(nbytes, seconds)
    return intercept / (2 * (n - 1)), 2 * (n - 1) / (n * slope)


def drawn_clusters(seed: int) -> list[tuple[int, float, float]]:
    rng = random.Random(seed)
    return [(n, rng.uniform(1e-6, 3e-5), rng.uniform(5e8, 4e10)) for n in (1, 2, 4, 32, 256, 3, 12)]


def test_hidden_ring_chunks(impl, run_alone):
    cases = [(1, 2), (9, 2), (11, 3), (17, 8), (2, 7), (64, 16)]
    check_chunk_lengths(impl, run_alone, {f"{m}/{n}": lengths(m, n) for m, n in cases})


def test_hidden_ring_phases(impl, run_on_ranks):
    check_reduce_scatter(impl, run_on_ranks, 4, 13, lengths(13, 4))
    check_all_gather(impl, run_on_ranks, 2, 5, lengths(5, 2))


def test_hidden_sweeps(impl, run_on_ranks, sweep_seed):
    seed = sweep_seed + SEED_OFFSET
    check_sweep(impl, run_on_ranks, 4, RING, seed, scale=5)
    check_sweep(impl, run_on_ranks, 4, DOUBLING, seed, scale=5)
    check_sweep(impl, run_on_ranks, 2, DOUBLING, seed, scale=2, group_sizes=(2,))


def test_hidden_alpha_beta(impl, run_alone, sweep_seed):
    seed = sweep_seed + SEED_OFFSET
    clusters = drawn_clusters(seed)
    rng = random.Random(seed)
    models = []
    for n, alpha, bandwidth in clusters:
        if n & (n - 1) == 0:
            args = [rng.uniform(1e3, 1e9), n, alpha, bandwidth]
            models.append({"args": args, "ring": ring(*args), "doubling": doubling(*args)})
    check_models(impl, run_alone, models)
    powers = [cluster for cluster in clusters if cluster[0] & (cluster[0] - 1) == 0]
    check_crossovers(impl, run_alone, [{"args": list(c), "bytes": crossover(*c)} for c in powers])
    choices = []
    for n, alpha, bandwidth in clusters:
        for size in (10 ** rng.uniform(2, 10) for _ in range(4)):
            args = [size, n, alpha, bandwidth]
            choices.append({"args": args, "choice": faster(*args)})
    check_choices(impl, run_alone, choices)
    fits, plans = [], []
    for n, alpha, bandwidth in powers[2:]:
        sizes = sorted(rng.uniform(1e3, 1e8) for _ in range(9))
        exact = [ring(s, n, alpha, bandwidth) for s in sizes]
        noisy = [s * rng.uniform(0.99, 1.01) for s in exact]
        fits.append({"n": n, "nbytes": sizes, "exact": exact, "alpha": alpha,
                     "bandwidth": bandwidth, "noisy": noisy,
                     "line": list(least_squares(sizes, noisy)),
                     "fitted": list(fitted(sizes, noisy, n))})
        plans.append({"n": n, "nbytes": sizes, "seconds": noisy,
                      "plan": [faster(size, n, *fitted(sizes, noisy, n)) for size in sizes]})
    check_fits(impl, run_alone, fits)
    check_plans(impl, run_alone, plans)


def test_hidden_contracts_on_other_draws(impl, run_alone, sweep_seed):
    seed = sweep_seed + CONTRACT_SEED
    assert_contract(run_alone, impl, "collectives", "ring_chunks", CHUNKS, chunk_draws(seed, (7, 31, 64)))
    measured = measurement_draws(seed, (2, 16))
    assert_contract(run_alone, impl, "alpha_beta", "fit_line", FIT,
                    {label: args[:2] for label, args in measured.items()})
    assert_contract(run_alone, impl, "alpha_beta", "fit_alpha_beta", FIT, measured)
    assert_contract(run_alone, impl, "alpha_beta", "all_reduce_plan", PLAN, measured)
