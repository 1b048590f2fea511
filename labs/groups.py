# Student file for the labs, generated from reference_impl/comm/groups.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Rank layout for tensor x pipeline x data (x context) parallelism: every rank's coordinates
and groups, a pure function of (world size, tp, pp, order, cp), so that it can be printed,
drawn and tested without a process group (``process_groups.py`` makes the real groups).

The definitions (the SageMaker model parallelism library's "Ranking Mechanism" page): a rank
has coordinates tp, pp and rdp (which of the W / (tp*pp) replicas), and cp when cp > 1; a group
is the ranks that agree on every coordinate except those listed: TP_GROUP tp, PP_GROUP pp,
RDP_GROUP rdp, DP_GROUP tp and rdp (and cp), MP_GROUP tp and pp, CP_GROUP cp, RDP_CP_GROUP cp
and rdp, WORLD all. A rank's ``tp_rank``, ``dp_rank``, ... is its index in that group, members
in increasing order (what ``dist.get_rank(group)`` returns). ``order`` lists the axes fastest
first (``sagemaker`` = pp-tp-rdp, ``megatron`` = tp-rdp-pp); :func:`rank_mesh` is the grid.
``python -m reference_impl.comm.groups --world-size 8 --tp 2 --pp 2`` prints the ranking
page's 8-GPU table.

Lab 1's notebook derives it ("1. Three coordinates, six kinds of group" to "4. The layout as a
grid"); the orders, Megatron's names, CP's groups: ``docs/library.md``, "Rank groups".
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from math import prod

import torch

AXES = ("tp", "pp", "rdp")
ORDERS = {"sagemaker": ("pp", "tp", "rdp"), "megatron": ("tp", "rdp", "pp")}
# Each kind of group: the axes along which its members differ (see the module docstring).
GROUP_AXES = {
    "TP": ("tp",),
    "PP": ("pp",),
    "DP": ("tp", "rdp"),
    "RDP": ("rdp",),
    "MP": ("tp", "pp"),
    "WORLD": AXES,
}
# The kinds a layout with cp > 1 adds (its DP and WORLD groups vary cp too).
CP_GROUP_AXES = {"CP": ("cp",), "RDP_CP": ("cp", "rdp")}


@dataclass(frozen=True)
class RankCoordinates:
    """One rank's place in every group; each ``*_rank`` is its index in that group."""

    rank: int
    tp_rank: int
    pp_rank: int
    rdp_rank: int
    dp_rank: int
    mp_rank: int
    cp_rank: int = 0  # index in the CP group (0 without context parallelism)

    def describe(self) -> str:
        """SageMaker's notation, e.g. ``GPU2: pp_rank 0, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 2``."""
        return (f"GPU{self.rank}: pp_rank {self.pp_rank}, tp_rank {self.tp_rank}, "
                f"rdp_rank {self.rdp_rank}, dp_rank {self.dp_rank}, mp_rank {self.mp_rank}")


@dataclass(frozen=True)
class RankLayout:
    """Every rank's coordinates and every group, for one (world size, tp, pp, order, cp)."""

    world_size: int
    tp: int
    pp: int
    order: tuple[str, ...]  # axes, fastest-varying first (cp, if any, just before rdp)
    groups: dict[str, tuple[tuple[int, ...], ...]]  # kind -> all groups of that kind
    ranks: tuple[RankCoordinates, ...]
    cp: int = 1

    @property
    def rdp(self) -> int:
        """Number of model replicas: the size of RDP_GROUP, W / (tp*cp*pp)."""
        return self.world_size // (self.tp * self.cp * self.pp)

    @property
    def axes(self) -> tuple[str, ...]:
        """The order with the cp axis (when cp > 1) just before rdp, fastest first."""
        if self.cp == 1:
            return self.order
        at = self.order.index("rdp")
        return self.order[:at] + ("cp",) + self.order[at:]

    def varying(self, kind: str) -> tuple[str, ...]:
        """The axes along which the members of a group of ``kind`` differ, cp included."""
        if kind in CP_GROUP_AXES:
            return CP_GROUP_AXES[kind]
        if self.cp > 1 and kind in ("DP", "WORLD"):
            return GROUP_AXES[kind] + ("cp",)
        return GROUP_AXES[kind]

    @property
    def dp(self) -> int:
        """Size of SageMaker's DP_GROUP, W / pp (it contains the TP group)."""
        return self.world_size // self.pp

    @property
    def mp(self) -> int:
        """Size of MP_GROUP, tp*pp: the ranks holding one whole model."""
        return self.tp * self.pp

    def coordinates(self, rank: int) -> RankCoordinates:
        _check_rank(rank, self.world_size)
        return self.ranks[rank]

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        """The members of ``rank``'s group of the given kind (``TP``, ``PP``, ``DP``, ...)."""
        _check_rank(rank, self.world_size)
        if kind not in self.groups:
            raise ValueError(f"unknown group kind {kind!r}; choose one of {', '.join(self.groups)}")
        return next(group for group in self.groups[kind] if rank in group)

    def describe(self) -> str:
        """One line per rank in SageMaker's notation (and its cp_rank, if cp > 1), then every
        group of every kind."""
        cp_rank = ", cp_rank {}" if self.cp > 1 else ""
        lines = [coords.describe() + cp_rank.format(coords.cp_rank) for coords in self.ranks]
        lines.append("")
        width = 11 if self.cp == 1 else 14
        for kind, groups in self.groups.items():
            label = kind if kind == "WORLD" else f"{kind}_GROUP"
            lines.append(f"{label + ':':<{width}}" + " ".join(str(list(group)) for group in groups))
        return "\n".join(lines)


def parse_order(order: str | tuple[str, ...]) -> tuple[str, ...]:
    """``sagemaker``, ``megatron``, or a permutation of tp, pp, rdp (fastest first)."""
    if isinstance(order, str):
        axes = ORDERS.get(order, tuple(order.split("-")))
    else:
        axes = tuple(order)
    if sorted(axes) != sorted(AXES):
        raise ValueError(
            f"unknown order {order!r}: use {' or '.join(repr(name) for name in ORDERS)}, or a "
            f"permutation of {', '.join(AXES)} written fastest-varying first, e.g. 'pp-tp-rdp'")
    return axes


def rank_positions(world_size: int, sizes: dict[str, int],
                   axes: tuple[str, ...]) -> list[dict[str, int]]:
    """Each rank's position along every axis, ``positions[rank][axis]`` in 0 .. sizes[axis]-1:
    the ranks counted in mixed radix over ``axes``, the first axis varying fastest (the
    notebook's section 2). Sizes whose product is not the world size are refused."""
    if prod(sizes[axis] for axis in axes) != world_size:
        shown = " x ".join(f"{axis} {sizes[axis]}" for axis in axes)
        raise ValueError(f"the axes' sizes {shown} = {prod(sizes[axis] for axis in axes)} "
                         f"ranks, but the world size is {world_size}: they must be equal")
    raise NotImplementedError('lab1: rank_positions (hint: "positions, groups and the layout" in the notebook)')


def groups_along(positions: list[dict[str, int]],
                 varying: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """The groups whose members differ along the axes ``varying`` only: each holds every rank
    that agrees with it on all the other axes, so each rank is in exactly one. Each group's
    ranks increasing and the groups sorted, so equal layouts compare equal."""
    unknown = sorted(set(varying) - set(positions[0]))
    if unknown:
        raise ValueError(f"groups along {unknown}: the positions have the axes "
                         f"{sorted(positions[0])} only")
    raise NotImplementedError('lab1: groups_along (hint: "positions, groups and the layout" in the notebook)')


def index_in(groups: tuple[tuple[int, ...], ...], rank: int) -> int:
    """``rank``'s index in whichever of ``groups`` holds it (members in increasing order): what
    ``dist.get_rank(group)`` returns there."""
    return next(group for group in groups if rank in group).index(rank)


def build_rank_layout(world_size: int, tp: int = 1, pp: int = 1,
                      order: str | tuple[str, ...] = "sagemaker", cp: int = 1) -> RankLayout:
    """Coordinates and groups of every rank for ``world_size`` ranks, ``tp`` x ``pp`` x the rest
    (with ``cp`` > 1: ``tp`` x ``cp`` x ``pp`` x the rest, see the module's docstring)."""
    for name, value in (("world size", world_size), ("tp", tp), ("pp", pp), ("cp", cp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if world_size % (tp * cp * pp):
        product = (f"tp*pp = {tp * pp} (tp={tp}, pp={pp})" if cp == 1 else
                   f"tp*cp*pp = {tp * cp * pp} (tp={tp}, cp={cp}, pp={pp})")
        raise ValueError(f"world size {world_size} is not divisible by {product}")
    axes = parse_order(order)
    # With cp > 1, the axis numbered rdp here is cp x rdp (cp the faster digit): split after.
    sizes = {"tp": tp, "pp": pp, "rdp": world_size // (tp * pp)}
    raise NotImplementedError('lab1: build_rank_layout (hint: "positions, groups and the layout" in the notebook)')
    if cp > 1:
        groups, ranks = _split_context_parallel(groups, ranks, cp)
    return RankLayout(world_size, tp, pp, axes, groups, ranks, cp)


def _split_context_parallel(groups: dict, ranks: tuple[RankCoordinates, ...], cp: int):
    """The groups and coordinates of a layout whose rdp axis was numbered as cp x rdp (cp the
    faster digit): that axis's groups are the RDP_CP groups; each, in increasing rank order,
    holds its cp x rdp ranks as rdp runs of cp consecutive members, the CP groups, and cp
    strided sets, the replicas (RDP groups)."""
    merged = groups["RDP"]
    cp_groups = tuple(group[start:start + cp] for group in merged
                      for start in range(0, len(group), cp))
    rdp_groups = tuple(group[offset::cp] for group in merged for offset in range(cp))
    kinds = dict(groups, RDP=tuple(sorted(rdp_groups)))
    world = kinds.pop("WORLD")
    kinds |= {"CP": tuple(sorted(cp_groups)), "RDP_CP": merged, "WORLD": world}

    ranks = tuple(replace(coords, rdp_rank=index_in(kinds["RDP"], coords.rank),
                          cp_rank=index_in(kinds["CP"], coords.rank)) for coords in ranks)
    return kinds, ranks


def _check_rank(rank: int, world_size: int) -> None:
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r} is out of range for world size {world_size} "
                         f"(ranks are 0..{world_size - 1})")


# ---------------------------------------------------------------- the layout as a grid

def rank_mesh(layout: RankLayout) -> tuple[torch.Tensor, tuple[str, ...]]:
    """The layout as a grid of ranks, and the names of its dimensions: one dimension per axis
    of the layout (cp too when cp > 1), ``mesh[i, j, k]`` the rank at position i, j, k along
    them. The dimensions go slowest axis first, so that the grid numbers the ranks row-major,
    the last dimension fastest, as ``DeviceMesh`` does (``process_groups.device_mesh``)."""
    raise NotImplementedError('lab1: rank_mesh (hint: "the grid and its sub-grids" in the notebook)')


def _check_names(names: tuple[str, ...], mesh: torch.Tensor, wanted=()) -> None:
    if len(names) != mesh.dim():
        raise ValueError(f"{len(names)} names {list(names)} for a mesh of {mesh.dim()} "
                         f"dimensions (shape {tuple(mesh.shape)})")
    unknown = [name for name in wanted if name not in names]
    if unknown:
        raise ValueError(f"{unknown} are not dimensions of the mesh, whose are {list(names)}")


def mesh_groups(mesh: torch.Tensor, names: tuple[str, ...],
                varying: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """The groups of the grid whose members differ along the dimensions ``varying`` only: one
    per position on the other dimensions, the sub-grid there. Each group's ranks increasing
    and the groups sorted, as the layout's: ``mesh_groups(*rank_mesh(layout),
    layout.varying(kind)) == layout.groups[kind]``."""
    _check_names(names, mesh, varying)
    raise NotImplementedError('lab1: mesh_groups (hint: "the grid and its sub-grids" in the notebook)')


def mesh_position(mesh: torch.Tensor, names: tuple[str, ...], rank: int) -> dict[str, int]:
    """Where ``rank`` sits in the grid: its index along each dimension, by name. Along one
    axis that is the rank's index in its group of that axis: its ``tp_rank``, ``pp_rank``,
    ``rdp_rank`` (and ``cp_rank``)."""
    _check_names(names, mesh)
    if not bool((mesh == rank).any()):
        raise ValueError(f"rank {rank} is not in the mesh (ranks {int(mesh.min())} to "
                         f"{int(mesh.max())}, shape {tuple(mesh.shape)})")
    raise NotImplementedError('lab1: mesh_position (hint: "the grid and its sub-grids" in the notebook)')


def mesh_group_rank(mesh: torch.Tensor, names: tuple[str, ...], varying: tuple[str, ...],
                    rank: int) -> int:
    """``rank``'s index in its group along ``varying`` (members increasing, as
    ``dist.get_rank(group)`` numbers them), from its position alone, without listing the
    group: its ``dp_rank`` for ``("tp", "rdp")``, its ``mp_rank`` for ``("tp", "pp")``."""
    _check_names(names, mesh, varying)
    raise NotImplementedError('lab1: mesh_group_rank (hint: "the grid and its sub-grids" in the notebook)')


def layout_parser(prog: str = "python -m reference_impl.comm.groups",
                  description: str = "Print every rank's coordinates and groups (SageMaker's "
                                     "notation).") -> argparse.ArgumentParser:
    """The command line of a layout: world size, tp, pp, cp and order (:func:`parsed_layout`
    builds it). ``figures.rank_groups`` adds the file its figure goes to."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    parser.add_argument("--cp", type=int, default=1,
                        help="context-parallel degree (its axis just faster than rdp)")
    parser.add_argument("--order", default="sagemaker",
                        help="sagemaker (pp-tp-rdp), megatron (tp-rdp-pp), or a permutation "
                             "of tp, pp, rdp, fastest-varying first")
    return parser


def parsed_layout(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RankLayout:
    """The layout the arguments describe; the parser exits with the reason if there is none."""
    try:
        return build_rank_layout(args.world_size, args.tp, args.pp, args.order, args.cp)
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> None:
    parser = layout_parser()
    print(parsed_layout(parser, parser.parse_args(argv)).describe())


if __name__ == "__main__":
    main()
