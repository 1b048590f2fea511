"""Lab 1, graded: the rank layout (``groups.py``), the same layout as a grid of ranks, and real
process groups (``process_groups.py``).

The expected layouts are the reference's, stored in ``tests/labs/snapshots/lab1.pt`` (every
group of every kind, every rank's coordinates, the grid's dimensions); SageMaker's 8-GPU table
is pasted from its page. The student's code runs in a helper process or on the ranks, and what
it returns comes back as data. What is swept (a failure names its case; ``--sweep-seed N``
draws other permuted groups):

* **Units, one process.** ``rank_positions`` for every (world size, tp, pp) up to 16 ranks in
  each of the six orders of tp, pp and rdp (first axis fastest), and for other numberings (one
  to four axes, a size of one); sizes that do not multiply to the world size are refused with
  a ValueError naming the numbers. ``groups_along`` given the stored positions, for every kind
  of every layout and every set of axes of the other numberings.
* **The layout.** ``build_rank_layout`` for the same layouts and cp 1 to 4: every group of
  every kind and every rank's coordinates; a tp*pp (*cp) that does not divide the world size
  is refused naming the numbers. Its CLI prints SageMaker's table; its figure.
* **The grid.** ``rank_mesh`` of every stored layout; ``mesh_groups``, ``mesh_position`` and
  ``mesh_group_rank`` given the stored grid: each kind's sub-grids are its groups, and a
  rank's place in the grid gives its coordinates.
* **Real groups, 8 CPU ranks.** ``members_by_all_reduce`` over groups of 1, 2 and 4 ranks
  (consecutive, strided, permuted) and the world: the members, and its communication contract,
  one all-reduce of 8 bytes over the group. ``new_groups`` given all those kinds at once:
  every rank's group of every kind, its members and its rank there, nothing communicated while
  creating, the whole world's group the default group, a kind that does not partition the
  world refused. ``create_process_groups`` and ``device_mesh`` of five stored layouts: each
  kind's group all-reduces over exactly its members, each mesh dimension is its kind's group.
"""
from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass
from math import prod

import pytest
import torch
import torch.distributed as dist

from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import group_layouts, label
from reference_impl.figures.rank_groups import plot_rank_groups

pytestmark = pytest.mark.lab1

# The SageMaker model parallelism library documentation, "Ranking Mechanism when Using a
# Combination of Pipeline Parallelism and Tensor Parallelism": 8 GPUs, tensor parallel degree 2,
# pipeline parallel degree 2, data parallel degree 4.
SAGEMAKER_8_GPU_TABLE = """\
GPU0: pp_rank 0, tp_rank 0, rdp_rank 0, dp_rank 0, mp_rank 0
GPU1: pp_rank 1, tp_rank 0, rdp_rank 0, dp_rank 0, mp_rank 1
GPU2: pp_rank 0, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 2
GPU3: pp_rank 1, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 3
GPU4: pp_rank 0, tp_rank 0, rdp_rank 1, dp_rank 2, mp_rank 0
GPU5: pp_rank 1, tp_rank 0, rdp_rank 1, dp_rank 2, mp_rank 1
GPU6: pp_rank 0, tp_rank 1, rdp_rank 1, dp_rank 3, mp_rank 2
GPU7: pp_rank 1, tp_rank 1, rdp_rank 1, dp_rank 3, mp_rank 3""".splitlines()

# The snapshot's columns: a rank's group of each kind (its index among the kind's sorted
# groups, -1 for a kind the layout lacks), then its coordinates.
KINDS = ("TP", "PP", "DP", "RDP", "MP", "WORLD", "CP", "RDP_CP")
COORDINATES = ("tp_rank", "pp_rank", "rdp_rank", "dp_rank", "mp_rank", "cp_rank")
COORDINATE_OF = {"TP": "tp_rank", "PP": "pp_rank", "RDP": "rdp_rank", "DP": "dp_rank",
                 "MP": "mp_rank", "CP": "cp_rank"}
# Along a single axis, a rank's position is its index in that axis's group.
POSITION_OF = {"tp": "tp_rank", "pp": "pp_rank", "rdp": "rdp_rank", "cp": "cp_rank"}
# The axes along which each kind's members differ (SageMaker's definitions; with cp > 1, DP
# and WORLD vary cp too).
VARYING = {"TP": ("tp",), "PP": ("pp",), "DP": ("tp", "rdp"), "RDP": ("rdp",),
           "MP": ("tp", "pp"), "WORLD": ("tp", "pp", "rdp"), "CP": ("cp",),
           "RDP_CP": ("cp", "rdp")}
# (world size, sizes, axes) that do not multiply to the world size, and (world, tp, pp, cp)
# that do not divide it.
REFUSED_POSITIONS = [(6, {"tp": 4, "pp": 1, "rdp": 2}, ("tp", "pp", "rdp")),
                     (12, {"a": 5, "b": 2}, ("a", "b")), (8, {"x": 3}, ("x",))]
REFUSED_LAYOUTS = [(6, 4, 1, 1), (6, 2, 2, 1), (12, 5, 1, 1), (8, 3, 1, 1), (16, 2, 2, 3),
                   (9, 2, 1, 1)]
# The real groups' layouts: (world size, tp, pp, cp, order as axes).
REAL_LAYOUTS = [(8, 2, 2, 1, "pp-tp-rdp"), (8, 2, 2, 1, "tp-rdp-pp"), (8, 4, 1, 1, "pp-tp-rdp"),
                (8, 2, 4, 1, "rdp-pp-tp"), (8, 2, 1, 2, "tp-rdp-pp")]


# ---------------------------------------------------------------- the stored layouts

@dataclass(frozen=True)
class Stored:
    """One layout of the snapshot, decoded: what the reference's build_rank_layout gives."""

    world: int
    tp: int
    pp: int
    cp: int
    order: str  # its axes, fastest first: "pp-tp-rdp"
    names: tuple[str, ...]  # the grid's dimensions, slowest first
    groups: dict  # kind -> [[ranks], ...], sorted
    ranks: tuple  # per rank, {coordinate name: value}

    @property
    def key(self) -> str:
        return f"{self.world}/{self.tp}/{self.pp}/{self.cp}/{self.order}"

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(self.order.split("-"))

    @property
    def sizes(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "cp": self.cp,
                "rdp": self.world // (self.tp * self.pp * self.cp)}

    def varying(self, kind: str) -> tuple[str, ...]:
        return VARYING[kind] + (("cp",) if self.cp > 1 and kind in ("DP", "WORLD") else ())

    def where(self) -> str:
        cp = f", cp {self.cp}" if self.cp > 1 else ""
        return f"world {self.world}, tp {self.tp}, pp {self.pp}{cp}, order {self.order}"


@functools.cache
def stored_layouts(which: str = "layouts") -> dict[str, Stored]:
    """The snapshot's layouts ("layouts": the public sweep, "layouts_more": the hidden one)."""
    stored = snapshot("lab1", which)
    rows, at, found = stored["rows"].tolist(), 0, {}
    for key, names in zip(stored["keys"], stored["names"]):
        world, tp, pp, cp, order = key.split("/")
        world = int(world)
        mine, at = rows[at:at + world], at + world
        groups = {}
        for column, kind in enumerate(KINDS):
            ids = [row[column] for row in mine]
            if ids[0] >= 0:
                groups[kind] = [[r for r in range(world) if ids[r] == g]
                                for g in range(max(ids) + 1)]
        ranks = tuple(dict(zip(COORDINATES, row[len(KINDS):])) for row in mine)
        found[key] = Stored(world, int(tp), int(pp), int(cp), order, tuple(names.split("-")),
                            groups, ranks)
    return found


def public_layouts(cp: tuple[int, ...] = (1, 2, 3, 4)) -> list[Stored]:
    return [layout for layout in stored_layouts().values() if layout.cp in cp]


@dataclass(frozen=True)
class Sweep:
    """What the unit checks run over: stored layouts, other numberings, refusals."""

    layouts: list  # for rank_positions and groups_along (cp 1), the layout, the grid
    places: list  # Stored layouts for mesh_position and mesh_group_rank
    numberings: dict  # the snapshot's other numberings
    stored: dict  # every stored layout of the tier, by key (a layout in the reversed order)
    refused_positions: list = ()
    refused_layouts: list = ()


@functools.cache
def public_sweep() -> Sweep:
    layouts = public_layouts()
    return Sweep(layouts, [layout for layout in layouts if layout.cp <= 2 and
                           layout.world in (8, 12)],
                 snapshot("lab1", "positions"), stored_layouts(), REFUSED_POSITIONS,
                 REFUSED_LAYOUTS)


def stored_grid(layout: Stored) -> torch.Tensor:
    """The stored layout as a grid: each rank written at its stored positions along the named
    dimensions."""
    grid = torch.full([layout.sizes[name] for name in layout.names], -1, dtype=torch.int64)
    for rank, coordinates in enumerate(layout.ranks):
        grid[tuple(coordinates[POSITION_OF[name]] for name in layout.names)] = rank
    return grid


def as_layout(groups_module, layout: Stored):
    """The stored layout as a RankLayout of the submission's module (not built by its
    build_rank_layout, so that the grid and the process groups are checked on their own)."""
    coordinates = groups_module.RankCoordinates
    return groups_module.RankLayout(
        layout.world, layout.tp, layout.pp, layout.axes,
        {kind: tuple(map(tuple, groups)) for kind, groups in layout.groups.items()},
        tuple(coordinates(rank=rank, **values) for rank, values in enumerate(layout.ranks)),
        layout.cp)


def attempt(function, *args):
    """What ``function(*args)`` returns, or {"raised": its exception} (named in the test)."""
    try:
        return function(*args)
    except Exception as error:
        return {"raised": f"{type(error).__name__}: {error}"}


def raised(value) -> str | None:
    return value.get("raised") if isinstance(value, dict) and "raised" in value else None


def fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


def shown(groups) -> str:
    text = " ".join(str(list(group)) for group in groups)
    return text if len(text) <= 200 else text[:200] + " ..."


# ---------------------------------------------------------------- rank_positions

def position_cases(layouts: list[Stored], numberings: dict) -> list[tuple]:
    """(where, world size, sizes, axes, expected positions as [[digit per axis]])."""
    cases = []
    for layout in layouts:
        if layout.cp == 1:
            sizes = {axis: layout.sizes[axis] for axis in layout.axes}
            cases.append((layout.where(), layout.world, sizes, layout.axes,
                          [[c[POSITION_OF[axis]] for axis in layout.axes] for c in layout.ranks]))
    for name, numbering in numberings.items():
        axes = tuple(numbering["axes"])
        sizes = dict(zip(axes, numbering["sizes"]))
        cases.append((f"numbering {name!r}", prod(sizes.values()), sizes, axes,
                      numbering["positions"]))
    return cases


def positions_cause(found: list, wanted: list, sizes: dict, axes: tuple) -> str | None:
    if not isinstance(found, list) or len(found) != len(wanted):
        return (f"expected a list of {len(wanted)} positions, one per rank, got "
                f"{type(found).__name__} of {len(found) if hasattr(found, '__len__') else '?'}")
    for rank, (position, digits) in enumerate(zip(found, wanted)):
        got = [position.get(axis) for axis in axes] if isinstance(position, dict) else position
        if got == digits:
            continue
        moving = [axis for axis in axes if sizes[axis] > 1]
        if len(moving) > 1 and isinstance(found[1], dict) and found[1].get(moving[-1]) == 1 \
                and found[1].get(moving[0]) == 0:
            return (f"the order's first axis must vary fastest (stride 1); here it varies "
                    f"slowest: rank 1 is one step along {moving[-1]}, not along {moving[0]}")
        return (f"rank {rank} is at {dict(zip(axes, got)) if isinstance(got, list) else got}, "
                f"expected {dict(zip(axes, digits))}: the ranks count in mixed radix over "
                f"{'-'.join(axes)}, {axes[0]} fastest (rank 1 one step along the first axis "
                f"whose size is over one)")
    return None


def refusal_cause(text: str | None, numbers) -> str | None:
    """Why a refusal is not the ValueError naming ``numbers``, or None if it is."""
    if text is None:
        return "it returned instead of raising a ValueError"
    if not text.startswith("ValueError") or not all(str(n) in text for n in numbers):
        return f"it raised {text!r}; expected a ValueError naming {', '.join(map(str, numbers))}"
    return None


def check_positions(found: list, sweep: Sweep) -> None:
    cases, refused = position_cases(sweep.layouts, sweep.numberings), sweep.refused_positions
    for (where, world, sizes, axes, wanted), got in zip(cases, found):
        call = f"rank_positions({world}, {sizes}, {axes}) [{where}]"
        if raised(got):
            fail(f"{call} raised {raised(got)}")
        cause = positions_cause(got, wanted, sizes, axes)
        if cause:
            fail(f"{call}: {cause}")
    for (world, sizes, axes), got in zip(refused, found[len(cases):]):
        cause = refusal_cause(raised(got), (world, prod(sizes.values())))
        if cause:
            fail(f"rank_positions({world}, {sizes}, {axes}): the sizes multiply to "
                 f"{prod(sizes.values())} ranks, not {world}; {cause}")


# ---------------------------------------------------------------- groups_along

def groups_along_cases(layouts: list[Stored], numberings: dict) -> list[tuple]:
    """(where, positions as dicts, [(varying, expected groups)])."""
    cases = []
    for layout in layouts:
        if layout.cp == 1:
            positions = [{axis: c[POSITION_OF[axis]] for axis in layout.axes} for c in layout.ranks]
            sets = [(layout.varying(kind), groups) for kind, groups in layout.groups.items()]
            cases.append((layout.where(), positions, sets))
    for name, numbering in numberings.items():
        positions = [dict(zip(numbering["axes"], digits)) for digits in numbering["positions"]]
        cases.append((f"numbering {name!r}", positions,
                      [(tuple(axis for axis in subset.split(",") if axis), groups)
                       for subset, groups in numbering["groups"].items()]))
    return cases


TUPLES = "the right groups, but return them as the layout holds them: a tuple of tuples"


def as_tuples(groups) -> bool:
    return isinstance(groups, tuple) and all(isinstance(group, tuple) for group in groups)


def groups_cause(found, wanted, positions: list[dict], varying: tuple) -> str | None:
    """Why ``found`` is not the partition ``wanted`` of ranks that agree outside ``varying``."""
    try:
        listed = [list(group) for group in found]
    except TypeError:
        return f"expected a tuple of groups (tuples of ranks), got {found!r}"
    if listed == wanted:
        return None if as_tuples(found) else TUPLES
    found = listed
    world = len(positions)
    count = {rank: sum(rank in group for group in found) for rank in range(world)}
    odd = next((rank for rank, n in count.items() if n != 1), None)
    if odd is not None:
        return f"every rank is in exactly one group; rank {odd} is in {count[odd]}"

    def outside(rank: int) -> dict:
        return {axis: value for axis, value in positions[rank].items() if axis not in varying}

    for group in found:
        for rank in group[1:]:
            if outside(rank) != outside(group[0]):
                axis = next(a for a in outside(rank) if outside(rank)[a] != outside(group[0])[a])
                return (f"ranks {group[0]} and {rank} share a group but differ along {axis}, "
                        f"which the group does not vary: a group's ranks agree on every axis "
                        f"outside {list(varying)}")
    home = {rank: i for i, group in enumerate(found) for rank in group}
    for a in range(world):
        for b in range(a + 1, world):
            if outside(a) == outside(b) and home[a] != home[b]:
                return (f"ranks {a} and {b} agree on every axis outside {list(varying)} but are "
                        "in different groups")
    if sorted(sorted(group) for group in found) == sorted(wanted):
        return ("the right groups, not in order: each group's ranks increasing and the groups "
                f"sorted, as tuples: got {shown(found)}, expected {shown(wanted)}")
    return f"got {shown(found)}, expected {shown(wanted)}"


def check_groups_along(found: list, sweep: Sweep) -> None:
    cases = groups_along_cases(sweep.layouts, sweep.numberings)
    for (where, positions, sets), results in zip(cases, found):
        for (varying, wanted), got in zip(sets, results):
            call = f"groups_along(positions, varying={varying}) [{where}]"
            if raised(got):
                fail(f"{call} raised {raised(got)}")
            cause = groups_cause(got, wanted, positions, varying)
            if cause:
                fail(f"{call}: {cause}")


# ---------------------------------------------------------------- build_rank_layout

def layout_as_data(layout) -> dict:
    """A RankLayout as plain data: its groups and each rank's coordinates."""
    return {"groups": {kind: [list(group) for group in groups]
                       for kind, groups in layout.groups.items()},
            "ranks": [{name: getattr(c, name) for name in COORDINATES} for c in layout.ranks]}


def layout_cause(got: dict, layout: Stored, stored: dict) -> str | None:
    """Why a layout differs from the stored one: the first kind or coordinate that does."""
    reversed_key = f"{layout.world}/{layout.tp}/{layout.pp}/{layout.cp}/" + \
        "-".join(reversed(layout.axes))
    backwards = stored.get(reversed_key)
    if sorted(got["groups"]) != sorted(layout.groups):
        return f"kinds of group {sorted(got['groups'])}, expected {sorted(layout.groups)}"
    for kind, wanted in layout.groups.items():
        mine = sorted(got["groups"][kind])
        if mine == sorted(wanted):
            continue
        if backwards is not None and mine == sorted(backwards.groups[kind]):
            return (f"{kind}_GROUP: got {shown(mine)}, expected {shown(wanted)}: the order's "
                    "first axis must vary fastest (stride 1); here it varies slowest")
        return (f"{kind}_GROUP: got {shown(mine)}, expected {shown(wanted)}: a group holds the "
                f"ranks that differ only along {' and '.join(layout.varying(kind))}")
    for rank, (mine, wanted) in enumerate(zip(got["ranks"], layout.ranks)):
        for name, value in wanted.items():
            if mine[name] != value:
                kind = next(k for k, n in COORDINATE_OF.items() if n == name)
                group = next(g for g in layout.groups[kind] if rank in g)
                return (f"rank {rank}'s {name} is {mine[name]}; it is the rank's index in its "
                        f"{kind}_GROUP {group}, i.e. {value}")
    return None


def check_layouts(found: list, sweep: Sweep) -> None:
    layouts, refused = sweep.layouts, sweep.refused_layouts
    for layout, got in zip(layouts, found):
        call = (f"build_rank_layout({layout.world}, tp={layout.tp}, pp={layout.pp}, "
                f"order={layout.order!r}{f', cp={layout.cp}' if layout.cp > 1 else ''})")
        if raised(got):
            fail(f"{call} raised {raised(got)}")
        cause = layout_cause(got, layout, sweep.stored)
        if cause:
            fail(f"{call} [{layout.where()}]: {cause}")
    for (world, tp, pp, cp), got in zip(refused, found[len(layouts):]):
        cause = refusal_cause(raised(got), (world, tp * pp * cp))
        if cause:
            fail(f"build_rank_layout({world}, tp={tp}, pp={pp}, cp={cp}): tp*pp*cp = "
                 f"{tp * pp * cp} does not divide the world size {world}; {cause}")


# ---------------------------------------------------------------- the grid

def mesh_cause(got: dict, layout: Stored) -> str | None:
    names, wanted = tuple(got["names"]), layout.names
    if names != wanted:
        if names == tuple(reversed(wanted)):
            return (f"dimensions {list(names)} go fastest axis first; the grid numbers ranks "
                    "row-major (the last dimension fastest, as DeviceMesh does), so its "
                    f"dimensions go slowest axis first: {list(wanted)}")
        return f"dimensions {list(names)}, expected the layout's axes slowest first {list(wanted)}"
    if "int" not in got["dtype"]:
        return f"the grid holds {got['dtype']}; it holds ranks, integers (DeviceMesh needs them)"
    shape = [layout.sizes[name] for name in names]
    if got["shape"] != shape:
        return f"shape {got['shape']}, expected {shape}: one dimension per axis, of its size"
    mesh = torch.tensor(got["mesh"])
    for rank, coordinates in enumerate(layout.ranks):
        at = tuple(coordinates[POSITION_OF[name]] for name in names)
        if int(mesh[at]) != rank:
            return (f"mesh{list(at)} is {int(mesh[at])}, but rank {rank} sits there (its "
                    f"{', '.join(f'{n} position {i}' for n, i in zip(names, at))})")
    return None


def check_meshes(found: list, sweep: Sweep) -> None:
    for layout, got in zip(sweep.layouts, found):
        call = f"rank_mesh(layout) [{layout.where()}]"
        if raised(got):
            fail(f"{call} raised {raised(got)}")
        cause = mesh_cause(got, layout)
        if cause:
            fail(f"{call}: {cause}")


def check_mesh_groups(found: list, sweep: Sweep) -> None:
    for layout, results in zip(sweep.layouts, found):
        for kind, wanted in layout.groups.items():
            got, varying = results[kind], layout.varying(kind)
            call = f"mesh_groups(grid, {list(layout.names)}, {varying}) [{layout.where()}]"
            if raised(got):
                fail(f"{call} raised {raised(got)}")
            if [list(group) for group in got] == wanted:
                if not as_tuples(got):
                    fail(f"{call}: {TUPLES}")
                continue
            sizes = {len(group) for group in got}
            if sizes == {layout.world // len(wanted[0])} and len(wanted[0]) not in sizes:
                fail(f"{call}: groups of {sizes.pop()} ranks, expected {len(wanted[0])}: a "
                     f"group's ranks differ along {list(varying)} and agree on the other "
                     f"dimensions; these vary the other dimensions ({kind}_GROUP expected "
                     f"{shown(wanted)})")
            if sorted(sorted(group) for group in got) == wanted:
                fail(f"{call}: the right groups, not in order: each group's ranks increasing "
                     f"and the groups sorted, as the layout's: got {shown(got)}")
            fail(f"{call}: got {shown(got)}, expected the layout's {kind}_GROUP {shown(wanted)}")


def check_places(found: list, sweep: Sweep) -> None:
    for layout, results in zip(sweep.places, found):
        for rank, (got, coordinates) in enumerate(zip(results, layout.ranks)):
            call = f"mesh_position(grid, {list(layout.names)}, {rank}) [{layout.where()}]"
            position = {name: coordinates[POSITION_OF[name]] for name in layout.names}
            if raised(got["position"]):
                fail(f"{call} raised {raised(got['position'])}")
            if got["position"] != position:
                fail(f"{call} = {got['position']}, expected {position}: the rank's index along "
                     "each dimension of the grid")
            for kind, index in got["group_rank"].items():
                group = next(g for g in layout.groups[kind] if rank in g)
                call = (f"mesh_group_rank(grid, {list(layout.names)}, {layout.varying(kind)}, "
                        f"{rank}) [{layout.where()}]")
                if raised(index):
                    fail(f"{call} raised {raised(index)}")
                if index != group.index(rank):
                    fail(f"{call} = {index}, expected {group.index(rank)}: the rank's index in "
                         f"its {kind}_GROUP {group} (members increasing); its positions along "
                         f"{list(layout.varying(kind))} read as one number, the grid's later "
                         "dimensions the less significant digits")


# ---------------------------------------------------------------- the CLI and the figure

def cli_output(impl, argv):
    """What ``groups.main(argv)`` prints."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        impl.module("groups").main(argv)
    return printed.getvalue()


def saved_figure(impl, target):
    """The figure of the 8-GPU layout saved as ``python -m reference_impl.figures.rank_groups``
    saves it: the file's first bytes."""
    layout = impl.module("groups").build_rank_layout(8, tp=2, pp=2)
    plot_rank_groups(layout).savefig(target, dpi=120, bbox_inches="tight")
    with open(target, "rb") as handle:
        return handle.read(8)


def figure_panels(impl):
    """The figure of the 8-GPU layout, as data: each panel's title and number of labels."""
    figure = plot_rank_groups(impl.module("groups").build_rank_layout(8, tp=2, pp=2))
    return [(axes.get_title(), len(axes.texts)) for axes in figure.axes]


def neighbour_groups(impl):
    """The PP groups under SageMaker's order and the TP groups under Megatron's, 16 ranks."""
    build = impl.module("groups").build_rank_layout
    return {"PP": [list(g) for g in build(16, 2, 4, "sagemaker").groups["PP"]],
            "TP": [list(g) for g in build(16, 2, 4, "megatron").groups["TP"]]}


# ---------------------------------------------------------------- one run, several verdicts

def units_alone(impl, sweep: Sweep, extras: bool) -> dict:
    """Every unit of ``groups.py`` over the sweep, in one helper process: each call's result, or
    what it raised; with ``extras``, the CLI's output, the figure and two layouts' groups."""
    groups = impl.module("groups")
    positions = position_cases(sweep.layouts, sweep.numberings)
    along = groups_along_cases(sweep.layouts, sweep.numberings)

    def grid(layout):
        mesh, names = groups.rank_mesh(as_layout(groups, layout))
        return {"mesh": mesh.tolist(), "dtype": str(mesh.dtype), "shape": list(mesh.shape),
                "names": list(names)}

    def place(grid_, layout, rank):
        return {"position": attempt(groups.mesh_position, grid_, layout.names, rank),
                "group_rank": {kind: attempt(groups.mesh_group_rank, grid_, layout.names,
                                             layout.varying(kind), rank)
                               for kind in layout.groups}}

    def built(*config):
        return layout_as_data(groups.build_rank_layout(*config))

    grids = {layout.key: stored_grid(layout) for layout in sweep.layouts + sweep.places}
    found = {
        "positions": [attempt(groups.rank_positions, world, sizes, axes)
                      for _, world, sizes, axes, _ in positions]
        + [attempt(groups.rank_positions, *case) for case in sweep.refused_positions],
        "groups_along": [[attempt(groups.groups_along, positions_, varying) for varying, _ in sets]
                         for _, positions_, sets in along],
        "layouts": [attempt(built, layout.world, layout.tp, layout.pp, layout.order, layout.cp)
                    for layout in sweep.layouts]
        + [attempt(built, world, tp, pp, "pp-tp-rdp", cp)
           for world, tp, pp, cp in sweep.refused_layouts],
        "meshes": [attempt(grid, layout) for layout in sweep.layouts],
        "mesh_groups": [{kind: attempt(groups.mesh_groups, grids[layout.key], layout.names,
                                       layout.varying(kind)) for kind in layout.groups}
                        for layout in sweep.layouts],
        "places": [[place(grids[layout.key], layout, rank) for rank in range(layout.world)]
                   for layout in sweep.places],
    }
    if extras:
        found["cli"] = {order: attempt(cli_output, impl, ["--world-size", "8", "--tp", "2",
                                                          "--pp", "2", "--order", order])
                        for order in ("sagemaker", "megatron")}
        found["panels"] = attempt(figure_panels, impl)
        found["neighbours"] = attempt(neighbour_groups, impl)
    return found


_RUNS: dict = {}


def once(key: tuple, run):
    """``run()`` once per key (the submission and what it runs): several tests judge the parts
    of one run. What it raised is raised to each of them."""
    if key not in _RUNS:
        try:
            _RUNS[key] = (run(), None)
        except (Exception, pytest.fail.Exception, pytest.skip.Exception) as error:
            _RUNS[key] = (None, error)
    value, error = _RUNS[key]
    if error is not None:
        raise error
    return value


def submission(impl) -> str:
    return getattr(impl, "name", repr(impl))


def units(impl, run_alone, tier: str, sweep: Sweep) -> dict:
    """The units' results over ``sweep``, run once per submission and tier."""
    return once((submission(impl), "units", tier),
                lambda: run_alone(units_alone, impl, sweep, tier == "public"))


def part(found, name: str):
    """One unit's results, or the test fails with what the unit raised (a stub: not started)."""
    value = found[name]
    if raised(value):
        fail(f"{name}: {raised(value)}")
    return value


# ---------------------------------------------------------------- real groups

def group_of(groups, rank):
    return next(list(group) for group in groups if rank in group)


def members_on_ranks(impl, layouts: dict):
    """Every group of every layout created here, on every rank, in the same order; then the
    submission's members_by_all_reduce over this rank's group of each, traced."""
    world, rank = dist.get_world_size(), dist.get_rank()
    handles = {name: [dist.group.WORLD if len(members) == world else dist.new_group(members)
                      for members in groups] for name, groups in layouts.items()}
    dist.barrier()  # every rank connected in them: one failing at once breaks no peer's
    found = {}
    for name, groups in layouts.items():
        mine = handles[name][[rank in members for members in groups].index(True)]
        with CommTracer() as trace:
            members = impl.module("process_groups").members_by_all_reduce(mine)
        found[name] = {"members": list(members), "calls": [c.as_data() for c in trace.calls]}
    return found


def member_layouts(world: int, sizes, seed: int) -> dict[str, list[list[int]]]:
    """{"consecutive 2": groups, ...}: every layout of groups of each size (sweeps)."""
    return {f"{name} {size}": groups for size in sizes
            for name, groups in group_layouts(world, size, seed).items()}


def check_members(impl, run_on_ranks, world: int, sizes, seed: int) -> None:
    layouts = member_layouts(world, sizes, seed)
    for rank, found in enumerate(run_on_ranks(members_on_ranks, world, impl, layouts)):
        for name, groups in layouts.items():
            mine = group_of(groups, rank)
            where = (f"members_by_all_reduce over the group {mine} "
                     f"[{label({'world': world, 'groups': name}, seed)}]")
            check_contract(found[name]["calls"], [expected("all_reduce", mine, 8)], where,
                           rank=rank, formula="one all-reduce of one int64 over the group")
            if found[name]["members"] != mine:
                fail(f"{where} on rank {rank} = {found[name]['members']}, expected {mine}: the "
                     "group's members as global ranks, increasing")


def new_groups_on_ranks(impl, kinds: dict, broken: dict):
    """The submission's new_groups of all ``kinds`` at once (traced), and of ``broken``."""
    process_groups = impl.module("process_groups")
    refused = attempt(process_groups.new_groups, broken)
    with CommTracer() as trace:
        made = process_groups.new_groups(kinds)
    found = {}
    for kind, (handle, members) in made.items():
        group_rank = dist.get_rank(handle)
        found[kind] = {"members": list(members), "group_rank": group_rank,
                       "ranks": dist.get_process_group_ranks(handle) if group_rank >= 0 else None,
                       "world": handle is dist.group.WORLD}
    return {"refused": raised(refused) if raised(refused) else None, "made": found,
            "calls": [call.as_data() for call in trace.calls]}


def scrambled(groups: list[list[int]]) -> list[list[int]]:
    """The groups in another order, each group's ranks reversed: new_groups sorts them."""
    return [list(reversed(group)) for group in reversed(groups)]


def check_new_groups(impl, run_on_ranks, world: int, sizes, seed: int) -> None:
    layouts = member_layouts(world, sizes, seed)
    kinds = {name: scrambled(groups) for name, groups in layouts.items()}
    broken = {"OVERLAPPING": [list(range(world - 1)), [0, world - 1]]}
    for rank, found in enumerate(run_on_ranks(new_groups_on_ranks, world, impl, kinds, broken)):
        case = label({"world": world, "kinds": len(kinds)}, seed)
        cause = refusal_cause(found["refused"], ("OVERLAPPING", world))
        if cause:
            fail(f"new_groups({broken}) on rank {rank} [{case}]: the groups hold rank 0 twice "
                 f"and do not partition the {world} ranks; {cause}")
        check_contract(found["calls"], [], f"new_groups [{case}]", rank=rank,
                       formula="creating groups communicates nothing of its own")
        if sorted(found["made"]) != sorted(kinds):
            fail(f"new_groups on rank {rank} [{case}] returned the kinds {sorted(found['made'])}, "
                 f"expected one group of each kind given: {sorted(kinds)}")
        for name, groups in layouts.items():
            mine, got = group_of(groups, rank), found["made"][name]
            where = f"new_groups on rank {rank}, kind {name!r} [{case}]"
            if got["group_rank"] < 0:
                fail(f"{where}: this rank is not a member of the group it kept (its rank there is "
                     "-1): each rank keeps the group of each kind that it belongs to")
            if got["ranks"] != mine:
                fail(f"{where}: the process group kept holds ranks {got['ranks']}, expected this "
                     f"rank's group {mine}")
            if got["members"] != mine:
                fail(f"{where}: members {got['members']}, expected {mine}, increasing")
            if got["group_rank"] != mine.index(rank):
                fail(f"{where}: this rank's rank in its group is {got['group_rank']}, expected "
                     f"{mine.index(rank)}")
            if len(mine) == world and not got["world"]:
                fail(f"{where}: a group of the whole world is the default group, "
                     "dist.group.WORLD, not a new one")


def real_groups_on_ranks(impl, layouts: list[Stored]):
    """create_process_groups and device_mesh of each stored layout: for each kind, what an
    all-reduce (traced) over this rank's group sums, and each mesh dimension's ranks."""
    return [real_groups_of(impl, layout) for layout in layouts]


def real_groups_of(impl, layout: Stored):
    groups_module, process_groups = impl.module("groups"), impl.module("process_groups")
    rank, device = dist.get_rank(), current_device()
    layout_here = as_layout(groups_module, layout)
    parallel = process_groups.create_process_groups(layout_here)
    found = {}
    for kind in layout.groups:
        handle = parallel.of_kind(kind)
        group_rank = dist.get_rank(handle)
        if group_rank < 0:
            found[kind] = {"group_rank": group_rank}
            continue
        value = torch.tensor([rank + 1], dtype=torch.int64, device=device)
        with CommTracer() as trace:
            dist.all_reduce(value, group=handle)
        found[kind] = {"group_rank": group_rank, "calls": [c.as_data() for c in trace.calls],
                       "ranks": sorted(dist.get_process_group_ranks(handle)),
                       "sum": int(value)}
    mesh = process_groups.device_mesh(layout_here, device.type)
    dims = {kind: process_groups.mesh_dim_names(layout_here, kind) for kind in layout.groups}
    spans = {kind: sorted(mesh[names].mesh.flatten().tolist()) for kind, names in dims.items()}
    single = {name: dist.get_process_group_ranks(mesh.get_group(name)) for name in layout.names}
    return {"kinds": found, "coordinates": vars(parallel.coordinates), "spans": spans,
            "single": single}


def check_real_groups(impl, run_on_ranks, layouts: list[Stored], tier: str, at: int) -> None:
    """The ``at``-th of ``layouts`` (all made in one run on the ranks, once per tier)."""
    layout = layouts[at]
    results = once((submission(impl), "real groups", tier),
                   lambda: run_on_ranks(real_groups_on_ranks, layout.world, impl, layouts))
    for rank, found in enumerate(result[at] for result in results):
        for kind, groups in layout.groups.items():
            mine, got = group_of(groups, rank), found["kinds"][kind]
            where = f"rank {rank}, create_process_groups, its {kind}_GROUP [{layout.where()}]"
            if got["group_rank"] < 0:
                fail(f"{where}: this rank is not a member of the group it kept (its rank there is "
                     "-1): each rank keeps the group of each kind that it belongs to")
            check_contract(got["calls"], [expected("all_reduce", mine, 8)],
                           f"an all-reduce over create_process_groups' {kind}_GROUP "
                           f"[{layout.where()}]", rank=rank,
                           formula=f"an all-reduce over the {kind}_GROUP {mine}")
            assert got["ranks"] == mine, f"{where}: it holds the ranks {got['ranks']}, expected {mine}"
            assert got["sum"] == sum(member + 1 for member in mine), (
                f"{where}: an all-reduce over it of each rank's rank + 1 gave {got['sum']}, not "
                f"the sum over {mine}: it reduces over other ranks than it holds")
            assert got["group_rank"] == mine.index(rank), f"{where}: rank in the group"
            mesh_where = f"rank {rank}, device_mesh [{layout.where()}]"
            if found["spans"][kind] != mine:
                fail(f"{mesh_where}: the sub-mesh of the {kind}_GROUP holds "
                     f"{found['spans'][kind]}, expected {mine}")
        for name in layout.names:
            kind = name.upper()
            mine = group_of(layout.groups[kind], rank)
            if found["single"][name] != mine:
                fail(f"rank {rank}, device_mesh [{layout.where()}]: its {name!r} dimension's "
                     f"group holds {found['single'][name]}, expected its {kind}_GROUP {mine}")
        assert found["coordinates"] == {"rank": rank, **layout.ranks[rank]}, f"rank {rank}"


def real_layout(world: int, tp: int, pp: int, cp: int, order: str) -> Stored:
    return stored_layouts()[f"{world}/{tp}/{pp}/{cp}/{order}"]


# ================================================================= the tests

def test_rank_positions_count_in_mixed_radix_first_axis_fastest(impl, run_alone):
    check_positions(units(impl, run_alone, "public", public_sweep())["positions"], public_sweep())


def test_groups_along_holds_the_ranks_that_agree_on_the_other_axes(impl, run_alone):
    check_groups_along(units(impl, run_alone, "public", public_sweep())["groups_along"],
                       public_sweep())


def test_layout_groups_and_coordinates_of_every_small_layout(impl, run_alone):
    check_layouts(units(impl, run_alone, "public", public_sweep())["layouts"], public_sweep())


def test_rank_mesh_puts_every_rank_at_its_positions(impl, run_alone):
    check_meshes(units(impl, run_alone, "public", public_sweep())["meshes"], public_sweep())


def test_mesh_groups_are_the_layout_groups(impl, run_alone):
    check_mesh_groups(units(impl, run_alone, "public", public_sweep())["mesh_groups"],
                      public_sweep())


def test_mesh_position_and_group_rank_are_the_coordinates(impl, run_alone):
    check_places(units(impl, run_alone, "public", public_sweep())["places"], public_sweep())


def test_fastest_axis_groups_are_neighbouring_ranks(impl, run_alone):
    found = part(units(impl, run_alone, "public", public_sweep()), "neighbours")
    for kind, order in (("PP", "sagemaker"), ("TP", "megatron")):
        for group in found[kind]:
            assert group == list(range(group[0], group[0] + len(group))), (
                f"{kind} groups under the {order} order (16 ranks, tp 2, pp 4): {group} is not a "
                f"run of neighbouring ranks, though {kind.lower()} is the order's fastest axis")


def test_cli_reproduces_the_sagemaker_8_gpu_table(impl, run_alone):
    cli = part(units(impl, run_alone, "public", public_sweep())["cli"], "sagemaker")
    assert cli.splitlines()[:8] == SAGEMAKER_8_GPU_TABLE


def test_cli_prints_the_groups_after_the_table(impl, run_alone):
    cli = part(units(impl, run_alone, "public", public_sweep())["cli"], "sagemaker")
    # SageMaker's ranking page: pipelines (0,1) (2,3) (4,5) (6,7); data parallelism over 0,2,4,6 and
    # 1,3,5,7; tensor parallelism over (0,2) (1,3) (4,6) (5,7).
    assert cli.splitlines()[9:] == [
        "TP_GROUP:  [0, 2] [1, 3] [4, 6] [5, 7]",
        "PP_GROUP:  [0, 1] [2, 3] [4, 5] [6, 7]",
        "DP_GROUP:  [0, 2, 4, 6] [1, 3, 5, 7]",
        "RDP_GROUP: [0, 4] [1, 5] [2, 6] [3, 7]",
        "MP_GROUP:  [0, 1, 2, 3] [4, 5, 6, 7]",
        "WORLD:     [0, 1, 2, 3, 4, 5, 6, 7]",
    ]


def test_megatron_order_puts_tp_peers_on_neighbouring_ranks(impl, run_alone):
    lines = part(units(impl, run_alone, "public", public_sweep())["cli"], "megatron").splitlines()
    assert lines[1] == "GPU1: pp_rank 0, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 1"
    assert lines[9] == "TP_GROUP:  [0, 1] [2, 3] [4, 5] [6, 7]"
    assert lines[11] == "DP_GROUP:  [0, 1, 2, 3] [4, 5, 6, 7]"
    # Megatron's data-parallel group is SageMaker's RDP_GROUP.
    assert lines[12] == "RDP_GROUP: [0, 2] [1, 3] [4, 6] [5, 7]"


def test_figure_has_a_panel_per_group_kind(impl, run_alone):
    panels = part(units(impl, run_alone, "public", public_sweep()), "panels")
    titles = [title for title, _ in panels]
    assert [title.split(":")[0].split("\n")[0] for title in titles] == [
        "TP_GROUP", "PP_GROUP", "DP_GROUP", "RDP_GROUP", "MP_GROUP", "WORLD"]
    assert "4 group(s) of 2" in titles[0]
    assert all(labels == 8 for _, labels in panels)  # one label per GPU


def test_the_figure_of_a_layout_saves(impl, run_alone, tmp_path):
    assert run_alone(saved_figure, impl, str(tmp_path / "groups.png")) == b"\x89PNG\r\n\x1a\n"


def test_members_by_all_reduce_finds_each_group(impl, run_on_ranks, sweep_seed):
    check_members(impl, run_on_ranks, 8, (1, 2, 4, 8), sweep_seed)


def test_new_groups_gives_every_rank_its_group_of_each_kind(impl, run_on_ranks, sweep_seed):
    check_new_groups(impl, run_on_ranks, 8, (1, 2, 4, 8), sweep_seed)


@pytest.mark.parametrize("at", range(len(REAL_LAYOUTS)),
                         ids=["-".join(map(str, config)) for config in REAL_LAYOUTS])
def test_real_groups_reduce_over_exactly_their_members(impl, run_on_ranks, at):
    check_real_groups(impl, run_on_ranks, [real_layout(*c) for c in REAL_LAYOUTS], "public", at)
