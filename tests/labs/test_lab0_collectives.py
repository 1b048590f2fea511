"""Lab 0, graded: the ring all-reduce built from send/recv, and the alpha-beta model.

Ring results are compared in float64 with the sum of every rank's tensor, computed here:
atol = rtol = 1e-12 (only the order of the additions differs). The alpha-beta formula and fit
run in a helper process and are checked here to rtol 1e-9 on exact synthetic data.
"""
import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close, assert_close_naming
from reference_impl.comm.device import current_device

pytestmark = pytest.mark.lab0

TOLERANCE = dict(atol=1e-12, rtol=1e-12)


def random_tensor(shape, seed):
    """Rank ``seed``'s tensor, built on the CPU (here or on a rank)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64)


def ring_result(impl, shape, members=None):
    """Rank r's ring_all_reduce result (returned, and left in place), on the world or a
    subgroup."""
    collectives = impl.module("collectives")
    group = dist.new_group(members) if members else None  # collective: every rank calls it
    if members and dist.get_rank() not in members:
        return None
    tensor = random_tensor(shape, seed=dist.get_rank()).to(current_device())
    returned = collectives.ring_all_reduce(tensor, group)
    return returned.cpu(), tensor.cpu()


def summed(shape, ranks):
    return sum(random_tensor(shape, seed=rank) for rank in ranks)


@pytest.mark.parametrize("world_size, shape", [(2, (8,)), (3, (4, 5)), (4, (2, 3, 7)),
                                               (4, (3,)), (1, (5,))],
                         ids=["2-ranks", "3-ranks-uneven", "4-ranks-3d", "fewer-elements-than-ranks",
                              "1-rank"])
def test_ring_all_reduce_matches_dist_all_reduce(impl, run_on_ranks, world_size, shape):
    expected = summed(shape, range(world_size))
    for rank, (returned, in_place) in enumerate(
            run_on_ranks(ring_result, world_size, impl, shape)):
        assert_close(in_place, expected, "ring_all_reduce's result", rank=rank,
                     likely_cause="a wrong chunk index in one of the two ring phases", **TOLERANCE)
        assert_close(returned, expected, "the tensor ring_all_reduce returns", rank=rank,
                     **TOLERANCE)


def test_ring_all_reduce_on_a_subgroup(impl, run_on_ranks):
    results = run_on_ranks(ring_result, 4, impl, (6,), [0, 2, 3])
    assert results[1] is None
    expected = summed((6,), (0, 2, 3))
    for rank in (0, 2, 3):
        returned, in_place = results[rank]
        assert_close(in_place, expected, "ring_all_reduce over ranks [0, 2, 3]", rank=rank,
                     likely_cause="using global ranks where group ranks are needed (or the "
                                  "reverse): neighbours must be found within the group",
                     **TOLERANCE)
        assert_close(returned, expected, "the tensor ring_all_reduce returns", rank=rank,
                     **TOLERANCE)


def after_reduce_scatter(impl, numel):
    collectives = impl.module("collectives")
    n, rank = dist.get_world_size(), dist.get_rank()
    tensor = random_tensor((numel,), seed=rank).to(current_device())
    chunks = collectives.ring_chunks(tensor, n)
    collectives.ring_reduce_scatter(chunks)
    owned = (rank + 1) % n
    return owned, chunks[owned].cpu()


def test_reduce_scatter_phase_leaves_each_rank_one_summed_chunk(impl, run_on_ranks):
    n, numel = 4, 10
    total_chunks = torch.tensor_split(summed((numel,), range(n)), n)  # the ring's chunks
    for rank, (owned, chunk) in enumerate(run_on_ranks(after_reduce_scatter, n, impl, numel)):
        expected = total_chunks[owned]
        # overwritten at every hop, a chunk ends as its first sender's: rank `owned`'s own
        overwritten = torch.tensor_split(random_tensor((numel,), seed=owned), n)[owned]
        assert_close_naming(
            chunk, expected, f"chunk {owned} after ring_reduce_scatter", rank=rank,
            mistakes={"the received chunk replaced this rank's copy instead of being added to "
                      "it: each hop must add its own contribution": overwritten},
            otherwise="the chunk sent and the chunk received at each step: after n-1 steps "
                      "rank r must hold the complete sum of chunk (r + 1) mod n, so each step "
                      "passes on the chunk that has just grown", **TOLERANCE)


def after_all_gather(impl, numel):
    collectives = impl.module("collectives")
    n, rank = dist.get_world_size(), dist.get_rank()
    tensor = torch.full((numel,), -1.0, dtype=torch.float64, device=current_device())
    chunks = collectives.ring_chunks(tensor, n)
    owned = (rank + 1) % n
    chunks[owned].fill_(owned + 1.0)  # the one complete chunk this rank holds
    collectives.ring_all_gather(chunks)
    return tensor.cpu()


def test_all_gather_phase_completes_every_chunk(impl, run_on_ranks):
    n, numel = 4, 10
    expected = torch.cat([torch.full((len(c),), k + 1.0, dtype=torch.float64)
                          for k, c in enumerate(torch.tensor_split(torch.empty(numel), n))])
    for rank, tensor in enumerate(run_on_ranks(after_all_gather, n, impl, numel)):
        assert_close(tensor, expected, "the tensor after ring_all_gather", rank=rank,
                     likely_cause="the chunk passed on at each step: it must be the complete "
                                  "chunk this rank got most recently (its own, (rank + 1) mod n, "
                                  "at the first step), stored by the receiver in the same place",
                     **TOLERANCE)


def alpha_beta_call(impl, function, *args):
    """``alpha_beta.<function>(*args)`` of the implementation, as plain numbers."""
    result = getattr(impl.module("alpha_beta"), function)(*args)
    return tuple(map(float, result)) if isinstance(result, (tuple, list)) else float(result)


@pytest.mark.parametrize("nbytes, n, alpha, bandwidth, expected", [
    (1e6, 4, 1e-5, 1e9, 6 * 1e-5 + 1.5 * 1e6 / 1e9),
    (1e6, 2, 1e-5, 1e9, 2 * 1e-5 + 1e6 / 1e9),
    (8e6, 8, 2e-6, 4e9, 14 * 2e-6 + 1.75 * 8e6 / 4e9),
    (1e6, 1, 1e-5, 1e9, 0.0),
])
def test_ring_all_reduce_seconds_is_the_alpha_beta_formula(impl, run_alone, nbytes, n, alpha,
                                                           bandwidth, expected):
    got = run_alone(alpha_beta_call, impl, "ring_all_reduce_seconds", nbytes, n, alpha, bandwidth)
    once = 2 * (n - 1) * alpha + (n - 1) / n * nbytes / bandwidth
    mistake = (": the bandwidth term counts each byte once, but a ring all-reduce sends it "
               "twice (the reduce-scatter, then the all-gather)"
               if n > 1 and got == pytest.approx(once, rel=1e-9) else "")
    assert got == pytest.approx(expected, rel=1e-9), (
        f"ring_all_reduce_seconds({nbytes:g}, n={n}, alpha={alpha:g}, B={bandwidth:g}) = {got}, "
        f"expected 2(n-1)*alpha + 2(n-1)/n * S/B = {expected}{mistake}")


@pytest.mark.parametrize("n, alpha, bandwidth", [(2, 5e-5, 2e9), (4, 2e-5, 3e9), (8, 1e-6, 1e10)])
def test_fit_alpha_beta_recovers_the_model(impl, run_alone, n, alpha, bandwidth):
    nbytes = [2.0 ** k for k in range(10, 25, 2)]
    seconds = [2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bandwidth for size in nbytes]
    fitted_alpha, fitted_bandwidth = run_alone(alpha_beta_call, impl, "fit_alpha_beta", nbytes,
                                               seconds, n)
    assert fitted_alpha == pytest.approx(alpha, rel=1e-6), (
        f"fitted alpha {fitted_alpha:g} s, the data were made with {alpha:g} s: the intercept "
        f"of the fitted line is 2(n-1)*alpha")
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6), (
        f"fitted bandwidth {fitted_bandwidth:g} B/s, the data were made with {bandwidth:g}: the "
        f"slope of the fitted line is 2(n-1)/(n*B)")
