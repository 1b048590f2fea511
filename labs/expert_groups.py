# Student file for the labs, generated from reference_impl/comm/expert_groups.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""The process groups of expert parallelism (GShard, Lepikhin et al. 2020; Megatron-core's
``expert_model_parallel_size``): which ranks share out the experts, and which hold copies.

Inside a data-parallel group of dp ranks, expert parallelism of size ep cuts it into dp / ep
EP groups of ep consecutive ranks (Megatron-core's order, experts varying fastest), rank i of
an EP group holding experts [i E/ep, (i+1) E/ep): tokens travel inside an EP group
(all-to-all). An EDP group ("expert data parallel", dp / ep ranks, stride ep) is the ranks
holding the same experts, one per EP group; everything dense stays replicated over the DP
group. With dp = 8 and ep = 4: EP [0 1 2 3] [4 5 6 7], EDP [0 4] [1 5] [2 6] [3 7].
:func:`expert_parallel_groups` is the pure layout, :func:`create_expert_groups` the torch groups.

Lab 9's notebook, "4. The EP and EDP groups"; ``docs/library.md``, "Beyond the three
dimensions" (expert parallelism).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from reference_impl.comm.process_groups import new_groups

KINDS = ("DP", "EP", "EDP")


def check_expert_parallel(dp: int, ep: int) -> None:
    """A ValueError naming the numbers unless ep divides the data-parallel size dp."""
    if ep < 1 or dp < 1:
        raise ValueError(f"ep and dp must be >= 1, got ep = {ep} and dp = {dp}")
    if dp % ep:
        raise ValueError(f"the data-parallel size dp = {dp} is not divisible by ep = {ep}: "
                         "expert parallelism cuts the data-parallel group into EP groups of ep ranks")


def experts_of_rank(num_experts: int, ep: int, ep_rank: int) -> range:
    """The experts (global indices) rank ``ep_rank`` of an EP group of ``ep`` holds."""
    if num_experts % ep:
        raise ValueError(f"{num_experts} experts are not divisible by ep = {ep}: each rank of "
                         "the EP group holds E / ep of them")
    per_rank = num_experts // ep
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


Groups = dict[str, tuple[tuple[int, ...], ...]]  # kind -> every group of that kind


def expert_parallel_groups(dp_groups: Sequence[Sequence[int]], ep: int) -> Groups:
    """Every DP, EP and EDP group (global ranks) for the given data-parallel groups: kind ->
    groups, in the order :func:`create_expert_groups` creates them. A DP group's ranks are
    taken in increasing order; its EP groups are runs of ep of them."""
    groups: dict[str, list[tuple[int, ...]]] = {kind: [] for kind in KINDS}
    # a torch group numbers its members in rank order
    for members in (tuple(sorted(group)) for group in dp_groups):
        check_expert_parallel(len(members), ep)
        groups["DP"].append(members)
        raise NotImplementedError('lab9: expert_parallel_groups (hint: "EP and EDP groups" in the notebook)')
    return {kind: tuple(found) for kind, found in groups.items()}


@dataclass(frozen=True)
class ExpertGroups:
    """This rank's DP, EP and EDP groups, with its place in them."""

    dp: dist.ProcessGroup
    ep: dist.ProcessGroup
    edp: dist.ProcessGroup
    dp_size: int
    ep_size: int
    ep_rank: int   # which slice of the experts this rank holds


def create_expert_groups(ep: int, dp_groups: Sequence[Sequence[int]] | None = None) -> ExpertGroups:
    """The torch groups of :func:`expert_parallel_groups`; this rank's. ``dp_groups``: every
    data-parallel group of the world (default: one, the world). Collective: every rank creates
    every group, in the same order, members of it or not (lab 1's ``new_groups``)."""
    world = dist.get_world_size()
    dp_groups = [tuple(range(world))] if dp_groups is None else [tuple(g) for g in dp_groups]
    if sorted(rank for group in dp_groups for rank in group) != list(range(world)):
        raise ValueError(f"the data-parallel groups {dp_groups} must hold each of the {world} "
                         "ranks exactly once")
    mine = new_groups(expert_parallel_groups(dp_groups, ep))
    ep_members = mine["EP"][1]
    return ExpertGroups(dp=mine["DP"][0], ep=mine["EP"][0], edp=mine["EDP"][0],
                        dp_size=len(mine["DP"][1]), ep_size=ep,
                        ep_rank=ep_members.index(dist.get_rank()))
