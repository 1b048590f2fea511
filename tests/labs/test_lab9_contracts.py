"""Lab 9, graded: what the capacity rule and the expert groups promise besides their values
(``reference_impl.course.contracts``: each property checked on the submission against itself).

* ``keep_within_capacity`` leaves its input as it was, places its result on its input's device,
  decides each token from the tokens before it only (the first t tokens kept as they are kept
  among all), does not depend on the experts' names (experts renamed, the same assignments
  kept), keeps nothing of no tokens, and everything when the capacity is the number of tokens.
* ``expert_parallel_groups`` depends on the ranks' order, not their numbers (ranks renumbered
  in increasing order, the groups renumbered), and takes the data-parallel groups, and each
  group's ranks, in any order.

Draws: 7 and 12 tokens, top-1 and top-2 routing over 3 and 4 experts, capacities 1 to 3;
groups of 8 and 12 ranks consecutive, strided and permuted. The hidden tier draws more.
"""
import pytest
import torch

from reference_impl.course.contracts import FollowsDevice, ReadsOnly, Relation, assert_contract
from reference_impl.course.sweeps import group_layouts

pytestmark = pytest.mark.lab9


def routing_draws(seed: int, tokens=(7, 12)) -> dict[str, tuple]:
    draws = {}
    for count in tokens:
        for top_k, experts in ((1, 3), (2, 4)):
            generator = torch.Generator().manual_seed(seed * 31 + count * 7 + top_k)
            index = torch.stack([torch.randperm(experts, generator=generator)[:top_k]
                                 for _ in range(count)])
            capacity = 1 + (count + seed) % 3
            draws[f"{count} tokens, top-{top_k} of {experts} experts, capacity {capacity}"] = (
                index, experts, capacity)
    return draws


def earlier_tokens_only(keep, args) -> tuple:
    index, experts, capacity = args
    first = index.shape[0] // 2
    return (keep(index[:first], experts, capacity), keep(index, experts, capacity)[:first])


def experts_renamed(keep, args) -> tuple:
    index, experts, capacity = args
    names = torch.arange(experts).flip(0)
    return (keep(names[index], experts, capacity), keep(index, experts, capacity))


def no_tokens(keep, args) -> tuple:
    index, experts, capacity = args
    empty = index[:0]
    return (keep(empty, experts, capacity), torch.zeros(empty.shape, dtype=torch.bool))


def room_for_all(keep, args) -> tuple:
    index, experts, _ = args
    return (keep(index, experts, index.shape[0]), torch.ones(index.shape, dtype=torch.bool))


CAPACITY = (ReadsOnly(), FollowsDevice(),
            Relation("decides each token from the tokens before it only", earlier_tokens_only),
            Relation("does not depend on the experts' names", experts_renamed),
            Relation("keeps nothing of no tokens", no_tokens),
            Relation("keeps every assignment when the capacity is the number of tokens",
                     room_for_all))


def group_draws(seed: int, worlds=((8, 4, 2), (12, 6, 3))) -> dict[str, tuple]:
    return {f"{world} ranks, {layout} DP groups of {size}, ep {ep}": (groups, ep)
            for world, size, ep in worlds
            for layout, groups in group_layouts(world, size, seed).items()}


def as_sets(groups) -> dict:
    return {kind: sorted(tuple(sorted(group)) for group in found) for kind, found in groups.items()}


def renumbered(expert_parallel_groups, args) -> tuple:
    dp_groups, ep = args
    number = {rank: 3 * rank + 5 for group in dp_groups for rank in group}  # increasing
    moved = expert_parallel_groups([[number[rank] for rank in group] for group in dp_groups], ep)
    expected = {kind: [[number[rank] for rank in group] for group in found]
                for kind, found in expert_parallel_groups(dp_groups, ep).items()}
    return (as_sets(moved), as_sets(expected))


def any_order(expert_parallel_groups, args) -> tuple:
    dp_groups, ep = args
    shuffled = [list(reversed(group)) for group in reversed(dp_groups)]
    return (as_sets(expert_parallel_groups(shuffled, ep)),
                   as_sets(expert_parallel_groups(dp_groups, ep)))


GROUPS = (ReadsOnly(),
          Relation("depends on the ranks' order, not their numbers", renumbered),
          Relation("takes the DP groups, and each group's ranks, in any order", any_order))


def test_keep_within_capacity_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "router", "keep_within_capacity", CAPACITY,
                    routing_draws(sweep_seed))


def test_expert_parallel_groups_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "expert_groups", "expert_parallel_groups", GROUPS,
                    group_draws(sweep_seed))
