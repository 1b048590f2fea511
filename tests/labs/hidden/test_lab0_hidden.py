"""Lab 0, hidden: the public checks on other seeds, lengths, group sizes and model parameters.

The sweeps draw other cases and permuted layouts (another seed) with longer tensors; the ring's
phases run on lengths and world sizes of their own; the alpha-beta checks get parameters drawn
here, their expected values computed by the reference in pytest's process (this file never
ships, so it may).
"""
import random

import pytest
import torch

from reference_impl.comm import alpha_beta
from reference_impl.comm.collectives import ring_chunks
from test_lab0_collectives import (DOUBLING, RING, check_all_gather, check_choices,
                                   check_chunk_lengths, check_crossovers, check_fits, check_models,
                                   check_plans, check_reduce_scatter, check_sweep)

pytestmark = pytest.mark.lab0

SEED_OFFSET = 7919  # the hidden sweeps' seeds: the public one plus this


def lengths(numel: int, n: int) -> list[int]:
    return [len(chunk) for chunk in ring_chunks(torch.arange(float(numel)), n)]


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
            models.append({"args": args, "ring": alpha_beta.ring_all_reduce_seconds(*args),
                           "doubling": alpha_beta.recursive_doubling_seconds(*args)})
    check_models(impl, run_alone, models)
    powers = [cluster for cluster in clusters if cluster[0] & (cluster[0] - 1) == 0]
    check_crossovers(impl, run_alone, [{"args": list(c), "bytes": alpha_beta.crossover_bytes(*c)}
                                       for c in powers])
    choices = []
    for n, alpha, bandwidth in clusters:
        for size in (10 ** rng.uniform(2, 10) for _ in range(4)):
            args = [size, n, alpha, bandwidth]
            choices.append({"args": args, "choice": alpha_beta.faster_all_reduce(*args)})
    check_choices(impl, run_alone, choices)
    fits, plans = [], []
    for n, alpha, bandwidth in powers[2:]:
        sizes = sorted(rng.uniform(1e3, 1e8) for _ in range(9))
        exact = [alpha_beta.ring_all_reduce_seconds(s, n, alpha, bandwidth) for s in sizes]
        noisy = [s * rng.uniform(0.99, 1.01) for s in exact]
        fits.append({"n": n, "nbytes": sizes, "exact": exact, "alpha": alpha,
                     "bandwidth": bandwidth, "noisy": noisy,
                     "line": list(alpha_beta.fit_line(sizes, noisy)),
                     "fitted": list(alpha_beta.fit_alpha_beta(sizes, noisy, n))})
        plans.append({"n": n, "nbytes": sizes, "seconds": noisy,
                      "plan": alpha_beta.all_reduce_plan(sizes, noisy, n)})
    check_fits(impl, run_alone, fits)
    check_plans(impl, run_alone, plans)
