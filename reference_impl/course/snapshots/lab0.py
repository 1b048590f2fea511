"""Lab 0's expected values: the ring's chunk lengths, the alpha-beta models' times, crossovers
and choices, and fits of synthetic measurements, each computed by the reference."""
from __future__ import annotations

import torch

from reference_impl.comm import alpha_beta
from reference_impl.comm.collectives import ring_chunks

# (elements, ranks): lengths that divide, that do not, fewer elements than ranks, none at all
CHUNKS = [(12, 4), (10, 4), (7, 3), (3, 4), (0, 3), (5, 1), (13, 5)]
# (nbytes, n, alpha, bandwidth): every model on 1, 2 and more ranks, latency- and bandwidth-bound
MODELS = [(1e6, 4, 1e-5, 1e9), (1e6, 2, 1e-5, 1e9), (8e6, 8, 2e-6, 4e9), (1e6, 1, 1e-5, 1e9),
          (2e3, 16, 5e-6, 2.5e10), (3e8, 64, 8e-6, 5e10)]
CLUSTERS = [(1, 1e-5, 1e9), (2, 1e-5, 1e9), (4, 1e-5, 1e9), (8, 2e-6, 4e9), (16, 5e-6, 2.5e10),
            (1024, 3e-6, 5e10)]  # (n, alpha, bandwidth)
FIT_SIZES = [2.0 ** k for k in range(10, 25, 2)]
FITS = [(2, 5e-5, 2e9), (4, 2e-5, 3e9), (8, 1e-6, 1e10)]  # (n, alpha, bandwidth) of synthetic data
NOISE = 0.01  # relative spread of the noisy synthetic measurements


def _noisy(seconds: list[float], seed: int) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    factors = 1 + NOISE * (2 * torch.rand(len(seconds), generator=generator, dtype=torch.float64) - 1)
    return [s * f for s, f in zip(seconds, factors.tolist())]


def _sizes_around(n: int, alpha: float, bandwidth: float) -> list[float]:
    """Sizes on both sides of the crossover, and the crossover itself where the two models
    give the same time to the bit (a tie), or a spread of sizes where there is none."""
    if n == 1 or n & (n - 1):
        return [1e3, 1e6, 1e9]
    crossover = alpha_beta.crossover_bytes(n, alpha, bandwidth)
    if crossover == float("inf"):
        return [1e3, 1e6, 1e9]
    tie = _tie(crossover, n, alpha, bandwidth)
    return [crossover / 4, crossover * 0.99, *([crossover] if tie else []), crossover * 1.01,
            crossover * 4]


def _tie(nbytes: float, n: int, alpha: float, bandwidth: float) -> bool:
    """Whether both algorithms run on ``n`` ranks and the models give them the same time."""
    return (n > 1 and not n & (n - 1)
            and alpha_beta.ring_all_reduce_seconds(nbytes, n, alpha, bandwidth)
            == alpha_beta.recursive_doubling_seconds(nbytes, n, alpha, bandwidth))


def make() -> dict:
    chunks = {f"{numel}/{n}": [len(c) for c in ring_chunks(torch.arange(float(numel)), n)]
              for numel, n in CHUNKS}
    models = [{"args": list(args), "ring": alpha_beta.ring_all_reduce_seconds(*args),
               "doubling": alpha_beta.recursive_doubling_seconds(*args)} for args in MODELS]
    crossovers = [{"args": list(args), "bytes": alpha_beta.crossover_bytes(*args)}
                  for args in CLUSTERS]
    choices = [{"args": [size, n, alpha, bandwidth],
                "choice": alpha_beta.faster_all_reduce(size, n, alpha, bandwidth),
                "tie": _tie(size, n, alpha, bandwidth)}
               for n, alpha, bandwidth in CLUSTERS + [(3, 1e-5, 1e9), (6, 2e-6, 4e9)]
               for size in _sizes_around(n, alpha, bandwidth)]
    fits = []
    for index, (n, alpha, bandwidth) in enumerate(FITS):
        exact = [alpha_beta.ring_all_reduce_seconds(size, n, alpha, bandwidth) for size in FIT_SIZES]
        noisy = _noisy(exact, seed=index)
        line = alpha_beta.fit_line(FIT_SIZES, noisy)
        fits.append({"n": n, "nbytes": FIT_SIZES, "exact": exact, "alpha": alpha,
                     "bandwidth": bandwidth, "noisy": noisy, "line": list(line),
                     "fitted": list(alpha_beta.fit_alpha_beta(FIT_SIZES, noisy, n))})
    plans = []
    for index, (n, alpha, bandwidth) in enumerate(CLUSTERS[2:]):
        sizes = sorted({2.0 ** k for k in range(8, 27, 2)}
                       | {round(s) for s in _sizes_around(n, alpha, bandwidth)})
        seconds = _noisy([alpha_beta.ring_all_reduce_seconds(s, n, alpha, bandwidth)
                          for s in sizes], seed=100 + index)
        plans.append({"n": n, "nbytes": sizes, "seconds": seconds,
                      "plan": alpha_beta.all_reduce_plan(sizes, seconds, n)})
    return {"chunk_lengths": chunks, "models": models, "crossovers": crossovers,
            "choices": choices, "fits": fits, "plans": plans}
