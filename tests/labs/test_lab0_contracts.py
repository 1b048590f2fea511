"""Lab 0, graded: what the ring's chunks, the fit and the plan promise besides their values
(``reference_impl.course.contracts``: each property checked on the submission against itself).

* ``ring_chunks`` leaves the tensor it cuts as it was, gives chunks in its dtype (float64,
  bfloat16) and on its device, whatever the default device;
* ``fit_line`` and ``fit_alpha_beta`` do not depend on the order of the measurements (the
  points shuffled, the same fit: within 1e-6 absolute, 1e-5 relative);
* ``all_reduce_plan`` decides each size by the size, not by its place in the list (sizes
  shuffled, the plan shuffled with them).

Draws: 5, 16 and 23 elements in 2 to 4 chunks; sizes of 1 KiB to 64 MiB on 4 and 8 ranks,
times from the ring's model with 5% noise, in increasing and in shuffled order. The hidden tier
draws other sizes and seeds.
"""
import random

import pytest
import torch

from reference_impl.course.contracts import (
    FollowsDevice, FollowsDtype, ReadsOnly, Relation, assert_contract)

pytestmark = pytest.mark.lab0


def chunk_draws(seed: int, lengths=(5, 16, 23)) -> dict[str, tuple]:
    generator = torch.Generator().manual_seed(seed)
    return {f"{length} elements in {n}": (torch.randn(length, generator=generator), n)
            for length in lengths for n in (2, 3, 4) if n <= length}


def measurement_draws(seed: int, ranks=(4, 8)) -> dict[str, tuple]:
    """(nbytes, seconds, n): ring all-reduce times by alpha-beta, noisy, in two orders."""
    rng = random.Random(seed)
    draws = {}
    for n in ranks:
        alpha, bandwidth = rng.uniform(2e-6, 2e-5), rng.uniform(5e9, 5e10)
        sizes = [2.0 ** power for power in range(10, 27, 2)]
        seconds = [2 * (n - 1) * (alpha + size / (n * bandwidth)) * rng.uniform(0.95, 1.05)
                   for size in sizes]
        draws[f"{n} ranks, sizes increasing"] = (sizes, seconds, n)
        order = rng.sample(range(len(sizes)), len(sizes))
        draws[f"{n} ranks, sizes shuffled"] = ([sizes[i] for i in order],
                                               [seconds[i] for i in order], n)
    return draws


def _shuffled(args, seed: int = 1):
    sizes, seconds, *rest = args
    order = random.Random(seed).sample(range(len(sizes)), len(sizes))
    return order, ([sizes[i] for i in order], [seconds[i] for i in order], *rest)


def same_fit_any_order(fit, args) -> tuple:
    _, shuffled = _shuffled(args)
    return (tuple(fit(*shuffled)), tuple(fit(*args)))


def plan_follows_sizes(plan, args) -> tuple:
    order, shuffled = _shuffled(args)
    before = plan(*args)
    return (list(plan(*shuffled)), [before[i] for i in order])


CHUNKS = (ReadsOnly(), FollowsDtype(torch.float64), FollowsDtype(torch.bfloat16), FollowsDevice())
FIT = (ReadsOnly(), Relation("does not depend on the order of the measurements", same_fit_any_order))
PLAN = (ReadsOnly(),
        Relation("decides each size by the size, not by its place in the list", plan_follows_sizes))


def test_ring_chunks_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "collectives", "ring_chunks", CHUNKS, chunk_draws(sweep_seed))


def test_fit_line_keeps_its_contract(impl, run_alone, sweep_seed):
    draws = {label: args[:2] for label, args in measurement_draws(sweep_seed).items()}
    assert_contract(run_alone, impl, "alpha_beta", "fit_line", FIT, draws)


def test_fit_alpha_beta_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "alpha_beta", "fit_alpha_beta", FIT,
                    measurement_draws(sweep_seed))


def test_all_reduce_plan_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "alpha_beta", "all_reduce_plan", PLAN,
                    measurement_draws(sweep_seed))
