"""Lab 1, hidden checks: the public checks' functions on other layouts (world sizes 18 to 64,
every order, cp 1 to 4), other numberings (five axes, a long axis), other refusals, and real
groups on 6 ranks with other seeds."""
import functools

import pytest

from reference_impl.course.snapshots import snapshot
from test_lab1_rank_groups import (Sweep, check_groups_along, check_layouts, check_members,
                                   check_mesh_groups, check_meshes, check_new_groups,
                                   check_places, check_positions, check_real_groups,
                                   stored_layouts, units)
from reference_impl.course.contracts import assert_contract
from test_lab1_contracts import ALONG, GRID, GROUP_RANK, POSITION, along_draws, grid_draws

pytestmark = pytest.mark.lab1
CONTRACT_SEED = 104729  # added to the sweep's seed: the contracts' other draws

REFUSED_POSITIONS = [(10, {"a": 2, "b": 2, "c": 2}, ("a", "b", "c")),
                     (18, {"pp": 3, "tp": 4, "rdp": 2}, ("pp", "tp", "rdp"))]
REFUSED_LAYOUTS = [(10, 4, 1, 1), (18, 4, 2, 1), (24, 5, 1, 1), (20, 2, 2, 3), (12, 1, 8, 1)]
# (world size, tp, pp, cp, order as axes), all made in one run on 6 ranks.
REAL_LAYOUTS = [(6, 3, 2, 1, "tp-rdp-pp"), (6, 2, 1, 1, "rdp-tp-pp"), (6, 1, 3, 1, "pp-rdp-tp"),
                (6, 3, 1, 2, "tp-pp-rdp")]
SEEDS = (1, 2)


@functools.cache
def hidden_sweep() -> Sweep:
    layouts = list(stored_layouts("layouts_more").values())
    return Sweep(layouts, [layout for layout in layouts if layout.world <= 32],
                 snapshot("lab1", "positions_more"), stored_layouts("layouts_more"),
                 REFUSED_POSITIONS, REFUSED_LAYOUTS)


def hidden_units(impl, run_alone) -> dict:
    return units(impl, run_alone, "hidden", hidden_sweep())


def test_hidden_rank_positions(impl, run_alone):
    check_positions(hidden_units(impl, run_alone)["positions"], hidden_sweep())


def test_hidden_groups_along(impl, run_alone):
    check_groups_along(hidden_units(impl, run_alone)["groups_along"], hidden_sweep())


def test_hidden_layouts(impl, run_alone):
    check_layouts(hidden_units(impl, run_alone)["layouts"], hidden_sweep())


def test_hidden_rank_mesh(impl, run_alone):
    check_meshes(hidden_units(impl, run_alone)["meshes"], hidden_sweep())


def test_hidden_mesh_groups(impl, run_alone):
    check_mesh_groups(hidden_units(impl, run_alone)["mesh_groups"], hidden_sweep())


def test_hidden_mesh_position_and_group_rank(impl, run_alone):
    check_places(hidden_units(impl, run_alone)["places"], hidden_sweep())


def test_hidden_members_by_all_reduce(impl, run_on_ranks):
    check_members(impl, run_on_ranks, 6, (1, 2, 3, 6), SEEDS[1])


def test_hidden_new_groups(impl, run_on_ranks):
    check_new_groups(impl, run_on_ranks, 6, (1, 2, 3, 6), SEEDS[0])


@pytest.mark.parametrize("at", range(len(REAL_LAYOUTS)),
                         ids=["-".join(map(str, config)) for config in REAL_LAYOUTS])
def test_hidden_real_groups(impl, run_on_ranks, at):
    layouts = [stored_layouts()[f"{w}/{tp}/{pp}/{cp}/{order}"]
               for w, tp, pp, cp, order in REAL_LAYOUTS]
    check_real_groups(impl, run_on_ranks, layouts, "hidden", at)


OTHER_GRIDS = {"rdp 3 x pp 2 x tp 2": ((3, 2, 2), ("rdp", "pp", "tp")),
               "rdp 2 x pp 2 x cp 2 x tp 2": ((2, 2, 2, 2), ("rdp", "pp", "cp", "tp"))}


def test_hidden_contracts_on_other_grids(impl, run_alone, sweep_seed):
    seed = sweep_seed + CONTRACT_SEED
    assert_contract(run_alone, impl, "groups", "groups_along", ALONG, along_draws(seed, OTHER_GRIDS))
    grids = grid_draws(seed, OTHER_GRIDS)
    assert_contract(run_alone, impl, "groups", "mesh_groups", GRID,
                    {label: (mesh, names, names[::2]) for label, (mesh, names) in grids.items()})
    assert_contract(run_alone, impl, "groups", "mesh_position", POSITION,
                    {label: (mesh, names, int(mesh.flatten()[0])) for label, (mesh, names) in grids.items()})
    assert_contract(run_alone, impl, "groups", "mesh_group_rank", GROUP_RANK,
                    {label: (mesh, names, names[1:], int(mesh.flatten()[0]))
                     for label, (mesh, names) in grids.items()})
