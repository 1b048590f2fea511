"""Lab 6, graded: what a rank's time, the step time and the straggler promise besides their
values (``reference_impl.course.contracts``: each property checked on the submission against
itself).

* ``rank_time`` leaves the ranges it is given as they were, and does not depend on the order of
  the threads or of the ranges within a thread (within 1e-6 absolute, 1e-5 relative);
* ``step_seconds`` does not depend on the order of the ranks;
* ``straggler`` leaves the waits as they were, does not depend on their order, and depends on
  the ranks' order, not their numbers (ranks renumbered in increasing order, the straggler
  renumbered).

Draws: two and three threads of overlapping compute and communication ranges, given out of
order; four and six ranks' spans and waits, a tie among them. The hidden tier draws more.
"""
import dataclasses
import random
from types import SimpleNamespace

import pytest

from reference_impl.course.contracts import ReadsOnly, Relation, assert_contract

pytestmark = pytest.mark.lab6


def ranges(rng: random.Random, count: int) -> list[tuple[float, float]]:
    starts = [rng.uniform(0.0, 1.0) for _ in range(count)]
    return [(start, start + rng.uniform(0.01, 0.2)) for start in starts]


def thread_draws(seed: int, threads=(2, 3)) -> dict[str, tuple]:
    rng = random.Random(seed)
    return {f"{count} threads, seed {seed}": (
                count, {100 + t: {"compute": ranges(rng, 5), "comm": ranges(rng, 3)}
                        for t in range(count)})
            for count in threads}


def threads_in_any_order(rank_time, args) -> tuple:
    rank, threads = args
    reordered = {thread: {kind: list(reversed(found)) for kind, found in reversed(kinds.items())}
                 for thread, kinds in reversed(threads.items())}
    return (dataclasses.asdict(rank_time(rank, reordered)),
                   dataclasses.asdict(rank_time(rank, threads)))


def span_draws(seed: int, worlds=(4, 6)) -> dict[str, tuple]:
    rng = random.Random(seed)
    return {f"{world} ranks": ([SimpleNamespace(rank=rank, span_s=rng.uniform(1.0, 2.0))
                                for rank in range(world)], 3) for world in worlds}


def ranks_in_any_order(step_seconds, args) -> tuple:
    ranks, steps = args
    return (step_seconds(list(reversed(ranks)), steps), step_seconds(ranks, steps))


def wait_draws(seed: int, worlds=(4, 6)) -> dict[str, tuple]:
    rng = random.Random(seed)
    draws = {}
    for world in worlds:
        waits = {rank: rng.uniform(0.1, 1.0) for rank in range(world)}
        tied = rng.sample(range(world), 2)
        waits[tied[0]] = waits[tied[1]] = min(waits.values()) / 2
        draws[f"{world} ranks, ranks {sorted(tied)} tied"] = (waits,)
    return draws


def waits_in_any_order(straggler, args) -> tuple:
    (waits,) = args
    return (straggler(dict(reversed(waits.items()))), straggler(waits))


def waits_renumbered(straggler, args) -> tuple:
    (waits,) = args
    return (straggler({3 * rank + 5: wait for rank, wait in waits.items()}),
                   3 * straggler(waits) + 5)


RANK_TIME = (ReadsOnly(), Relation("does not depend on the order of the threads or their ranges",
                                   threads_in_any_order))
STEP = (ReadsOnly(), Relation("does not depend on the order of the ranks", ranks_in_any_order))
STRAGGLER = (ReadsOnly(),
             Relation("does not depend on the order of the waits", waits_in_any_order),
             Relation("depends on the ranks' order, not their numbers", waits_renumbered))


def test_rank_time_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "trace_analysis", "rank_time", RANK_TIME,
                    thread_draws(sweep_seed))


def test_step_seconds_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "trace_analysis", "step_seconds", STEP, span_draws(sweep_seed))


def test_straggler_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "trace_analysis", "straggler", STRAGGLER,
                    wait_draws(sweep_seed))
