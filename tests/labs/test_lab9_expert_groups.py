"""Lab 9, graded: the groups of expert parallelism (``expert_groups.py``), checked as data in one
helper process, no ranks launched.

For data-parallel groups on 8 ranks, laid out with ``reference_impl.course.sweeps`` from the
seed of ``--sweep-seed``: the world with ep = 1, 2, 4, 8; two groups of 4 consecutive, strided
and permuted ranks with ep = 2 and 4; four permuted groups of 2 with ep = 2; and groups given
unsorted: the student's ``expert_parallel_groups`` against the reference's lists (the snapshot
``tests/labs/snapshots/lab9.pt``). A wrong list is named by the invariant it breaks: an EP group
holds every expert once, an EDP group the same experts once per EP group.
Then the refusals, naming the numbers: dp not divisible by ep, E not divisible by ep.
"""
import pytest

from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import group_layouts, label

pytestmark = pytest.mark.lab9


def cases(seed):
    """(layout name, data-parallel groups, ep) on 8 ranks."""
    found = [("world", group_layouts(8, 8, seed)["world"], ep) for ep in (1, 2, 4, 8)]
    for name, groups in group_layouts(8, 4, seed).items():
        found += [(f"{name} groups of 4", groups, ep) for ep in (2, 4)]
    found.append(("permuted groups of 2", group_layouts(8, 2, seed)["permuted"], 2))
    found.append(("unsorted", [[6, 0, 2, 4], [7, 5, 3, 1]], 2))  # given unsorted
    return [(name, tuple(tuple(g) for g in groups), ep) for name, groups, ep in found]


def groups_alone(impl, seed):
    expert_groups = impl.module("expert_groups")
    found = {}
    for _, dp_groups, ep in cases(seed):
        groups = expert_groups.expert_parallel_groups(dp_groups, ep)
        found[f"{dp_groups}/{ep}"] = {kind: [list(group) for group in groups[kind]]
                                      for kind in ("DP", "EP", "EDP")}
    found["experts"] = [list(expert_groups.experts_of_rank(8, 4, rank)) for rank in range(4)]
    refusals = {}
    for what, call in (("dp", lambda: expert_groups.expert_parallel_groups([range(6)], 4)),
                       ("experts", lambda: expert_groups.experts_of_rank(6, 4, 0))):
        try:
            call()
            refusals[what] = None
        except ValueError as error:
            refusals[what] = str(error)
    found["refusals"] = refusals
    return found


def stored(seed):
    try:
        return snapshot("lab9", f"groups seed {seed}")
    except KeyError:
        raise AssertionError(f"lab 9's expected values are stored for the graded seeds only, "
                             f"not for --sweep-seed {seed}: run without --sweep-seed") from None


def strides(found, dp_groups):
    """The distances, within its sorted DP group, between neighbouring members of each group
    of ``found`` (None where a group is not inside one DP group)."""
    found_strides = set()
    for group in found:
        members = next((sorted(g) for g in dp_groups if group and group[0] in g), [])
        if not set(group) <= set(members):
            return None
        places = [members.index(rank) for rank in group]
        found_strides |= {b - a for a, b in zip(places, places[1:])}
    return found_strides


def named_mistake(kind, found, right, dp_groups, ep):
    """What a wrong list of groups most likely comes from, from the invariants it breaks."""
    dp = len(dp_groups[0])
    spacing = strides(found, dp_groups)
    if kind == "EP" and spacing and spacing != {1} and len(spacing) == 1:
        return ("EP groups strided instead of consecutive ranks: an EP group is ep consecutive "
                "members of the DP group (they hold every expert once between them; the "
                "all-to-all stays among neighbours, inside a node)")
    if kind == "EDP" and spacing == {1}:
        return ("EDP groups made of consecutive ranks instead of ranks ep apart: an EDP group "
                "holds the same experts, one member from each EP group")
    if sorted(map(sorted, found)) == sorted(map(sorted, right)):
        return ("the right members in another order: a group's ranks in increasing order, "
                "groups in the order of their first rank, DP group by DP group")
    return (f"each DP group of {dp} holds dp / ep = {dp // ep} EP groups of {ep} and {ep} EDP "
            f"groups of {dp // ep}: see the notebook's section on the EP and EDP groups")


def check_groups(impl, run_alone, seed):
    found, wants = run_alone(groups_alone, impl, seed), stored(seed)
    for name, dp_groups, ep in cases(seed):
        right, actual = wants[f"{dp_groups}/{ep}"], found[f"{dp_groups}/{ep}"]
        for kind in ("DP", "EP", "EDP"):
            assert actual[kind] == right[kind], (
                f"{kind} groups for data-parallel groups {[list(g) for g in dp_groups]} and "
                f"ep = {ep} ({label({'layout': name, 'ep': ep}, seed)}): got "
                f"{actual[kind]}, expected {right[kind]}. "
                f"{named_mistake(kind, actual[kind], right[kind], dp_groups, ep)}")
    assert found["experts"] == [[0, 1], [2, 3], [4, 5], [6, 7]], (
        f"experts_of_rank(8 experts, ep = 4, rank r) gave {found['experts']}: rank r of an EP "
        "group holds experts [r E/ep, (r + 1) E/ep)")


def test_ep_and_edp_groups_are_the_rule(impl, run_alone, sweep_seed):
    check_groups(impl, run_alone, sweep_seed)


def test_expert_parallel_refuses_what_does_not_divide(impl, run_alone, sweep_seed):
    found = run_alone(groups_alone, impl, sweep_seed)["refusals"]
    for what, numbers, rule in (("dp", ("6", "4"), "a data-parallel group of 6 ranks with ep = 4"),
                                ("experts", ("6", "4"), "6 experts over ep = 4")):
        message = found[what]
        assert message is not None, f"{rule} was accepted: it must raise a ValueError"
        assert all(number in message for number in numbers), (
            f"{rule} raised ValueError({message!r}), which should name the numbers {numbers}")
