"""Lab 1, graded: what the positions, the groups and the grid promise besides their values
(``reference_impl.course.contracts``: each property checked on the submission against itself).

* ``rank_positions`` does not depend on the order of the sizes' entries (the axes give it);
* ``groups_along`` and ``mesh_groups`` do not depend on the order of the axes that vary, and
  renumbering the ranks renumbers the groups (a grid need not be numbered row by row);
* ``mesh_position`` follows a rank wherever the grid puts it (ranks renumbered: the renumbered
  rank has the same position);
* ``mesh_group_rank`` depends on the ranks' order, not their numbers (ranks renumbered in
  increasing order, the same index in the group).

Draws: worlds of 6, 8 and 12 ranks in two and three axes, grids numbered row by row and
shuffled. The hidden tier draws other grids and seeds.
"""
import itertools
import random

import pytest
import torch

from reference_impl.course.contracts import ReadsOnly, Relation, assert_contract

pytestmark = pytest.mark.lab1

GRIDS = {"rdp 2 x pp 2 x tp 2": ((2, 2, 2), ("rdp", "pp", "tp")),
         "pp 3 x tp 2": ((3, 2), ("pp", "tp")),
         "rdp 2 x cp 3 x tp 2": ((2, 3, 2), ("rdp", "cp", "tp"))}


def renumbering(world: int, seed: int) -> list[int]:
    return random.Random(seed).sample(range(world), world)


def grid_draws(seed: int, grids=GRIDS) -> dict[str, tuple]:
    """(mesh, names): each grid numbered row by row and shuffled."""
    draws = {}
    for label, (shape, names) in grids.items():
        ranks = torch.arange(torch.Size(shape).numel())
        draws[f"{label}, row by row"] = (ranks.reshape(shape), names)
        draws[f"{label}, shuffled"] = (ranks[renumbering(len(ranks), seed)].reshape(shape), names)
    return draws


def position_draws(seed: int, grids=GRIDS) -> dict[str, tuple]:
    """(world, sizes, axes) for rank_positions; the axes in the grid's order, fastest first."""
    return {label: (torch.Size(shape).numel(), dict(zip(names, shape)), tuple(reversed(names)))
            for label, (shape, names) in grids.items()}


def as_set(groups) -> list:
    return sorted(tuple(sorted(group)) for group in groups)


def sizes_in_any_order(rank_positions, args) -> tuple:
    world, sizes, axes = args
    return (rank_positions(world, dict(reversed(sizes.items())), axes),
                   rank_positions(world, sizes, axes))


def along_any_axis_order(groups_along, args) -> tuple:
    positions, varying = args
    return (as_set(groups_along(positions, varying[::-1])),
                   as_set(groups_along(positions, varying)))


def along_renumbered(groups_along, args) -> tuple:
    positions, varying = args
    number = renumbering(len(positions), 3)
    moved = [positions[number.index(new)] for new in range(len(positions))]  # rank -> number[rank]
    expected = [[number[rank] for rank in group] for group in groups_along(positions, varying)]
    return (as_set(groups_along(moved, varying)), as_set(expected))


def grid_any_axis_order(mesh_groups, args) -> tuple:
    mesh, names, varying = args
    return (as_set(mesh_groups(mesh, names, varying[::-1])),
                   as_set(mesh_groups(mesh, names, varying)))


def grid_renumbered(mesh_groups, args) -> tuple:
    mesh, names, varying = args
    number = torch.tensor(renumbering(mesh.numel(), 5))
    expected = [[int(number[rank]) for rank in group] for group in mesh_groups(mesh, names, varying)]
    return (as_set(mesh_groups(number[mesh], names, varying)), as_set(expected))


def position_follows_rank(mesh_position, args) -> tuple:
    mesh, names, _ = args
    number = torch.tensor(renumbering(mesh.numel(), 7))
    return ({rank: mesh_position(number[mesh], names, int(number[rank]))
                    for rank in range(mesh.numel())},
                   {rank: mesh_position(mesh, names, rank) for rank in range(mesh.numel())})


def group_rank_by_order(mesh_group_rank, args) -> tuple:
    mesh, names, varying, _ = args
    return ([mesh_group_rank(3 * mesh + 5, names, varying, 3 * rank + 5)
                    for rank in range(mesh.numel())],
                   [mesh_group_rank(mesh, names, varying, rank) for rank in range(mesh.numel())])


POSITIONS = (ReadsOnly(), Relation("does not depend on the order of the sizes' entries",
                                   sizes_in_any_order))
ALONG = (ReadsOnly(),
         Relation("does not depend on the order of the axes that vary", along_any_axis_order),
         Relation("renumbers its groups when the ranks are renumbered", along_renumbered))
GRID = (ReadsOnly(),
        Relation("does not depend on the order of the dimensions that vary", grid_any_axis_order),
        Relation("renumbers its groups when the grid's ranks are renumbered", grid_renumbered))
POSITION = (ReadsOnly(), Relation("follows a rank wherever the grid puts it", position_follows_rank))
GROUP_RANK = (ReadsOnly(), Relation("depends on the ranks' order, not their numbers",
                                    group_rank_by_order))


def test_rank_positions_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "groups", "rank_positions", POSITIONS, position_draws(0))


def along_draws(seed: int, grids=GRIDS) -> dict[str, tuple]:
    """(positions, varying): every point of the grid, given to the ranks in a shuffled order."""
    draws = {}
    for label, (shape, names) in grids.items():
        points = [dict(zip(names, point)) for point in itertools.product(*map(range, shape))]
        random.Random(seed).shuffle(points)
        draws[label] = (points, names[:2])
    return draws


def test_groups_along_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "groups", "groups_along", ALONG, along_draws(sweep_seed))


def test_mesh_groups_keeps_its_contract(impl, run_alone, sweep_seed):
    draws = {label: (mesh, names, names[::2]) for label, (mesh, names) in grid_draws(sweep_seed).items()}
    assert_contract(run_alone, impl, "groups", "mesh_groups", GRID, draws)


def test_mesh_position_keeps_its_contract(impl, run_alone, sweep_seed):
    draws = {label: (mesh, names, int(mesh.flatten()[-1]))
             for label, (mesh, names) in grid_draws(sweep_seed).items()}
    assert_contract(run_alone, impl, "groups", "mesh_position", POSITION, draws)


def test_mesh_group_rank_keeps_its_contract(impl, run_alone, sweep_seed):
    draws = {label: (mesh, names, names[1:], int(mesh.flatten()[-1]))
             for label, (mesh, names) in grid_draws(sweep_seed).items()}
    assert_contract(run_alone, impl, "groups", "mesh_group_rank", GROUP_RANK, draws)
