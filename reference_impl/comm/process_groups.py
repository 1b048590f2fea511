"""Turn a :class:`~reference_impl.comm.groups.RankLayout` into real ``torch.distributed`` groups.

The thin last step after the pure layout (``groups.py``): call it on every rank, after the
default process group is initialised (the launcher does that), with the same layout::

    groups = create_process_groups(build_rank_layout(dist.get_world_size(), tp=2, pp=2))
    dist.all_reduce(grad, group=groups.rdp)

:func:`device_mesh` gives the same layout as PyTorch's ``DeviceMesh``; :func:`new_groups`
creates groups of any kinds given as lists of ranks, and :func:`members_by_all_reduce` checks
a group by communicating over it. Lab 1's notebook, "5. Real process groups"; the mesh and the
context-parallel groups (``cp``, ``rdp_cp``): ``docs/library.md``, "Rank groups".
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from reference_impl.comm.groups import RankCoordinates, RankLayout, rank_mesh
from reference_impl.comm.device import current_device


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's process group of every kind, with its coordinates."""

    layout: RankLayout
    coordinates: RankCoordinates
    tp: dist.ProcessGroup
    pp: dist.ProcessGroup
    dp: dist.ProcessGroup
    rdp: dist.ProcessGroup
    mp: dist.ProcessGroup
    world: dist.ProcessGroup
    cp: dist.ProcessGroup | None = None  # layouts with cp > 1 only
    rdp_cp: dist.ProcessGroup | None = None

    @property
    def rdp_cp_or_rdp(self) -> dist.ProcessGroup:
        """The ranks that hold other tokens of the same stage's batch: RDP x CP, or RDP
        without context parallelism."""
        return self.rdp if self.rdp_cp is None else self.rdp_cp

    def of_kind(self, kind: str) -> dist.ProcessGroup:
        """The group for a kind name of the layout (``TP``, ``PP``, ``DP``, ``RDP``, ``MP``,
        ``WORLD``; ``CP``, ``RDP_CP``)."""
        return getattr(self, kind.lower())


def new_groups(groups: dict[str, Sequence[Sequence[int]]]
               ) -> dict[str, tuple[dist.ProcessGroup, tuple[int, ...]]]:
    """Create every group of every kind (``kind -> its groups``, each kind's groups holding
    every rank once); return this rank's group of each kind, with its members (increasing).

    ``dist.new_group`` is collective: every rank creates every group, in the same order,
    including the groups it is not a member of. A group of the whole world is the default
    group, ``dist.group.WORLD``, rather than a new one.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    for kind in groups:
        held = sorted(member for members in groups[kind] for member in members)
        if held != list(range(world)):
            raise ValueError(f"the {kind} groups {[list(members) for members in groups[kind]]} "
                             f"must hold each of the {world} ranks exactly once")
    mine: dict[str, tuple[dist.ProcessGroup, tuple[int, ...]]] = {}
    # BEGIN SOLUTION lab1: new_groups (hint: "real groups and their members" in the notebook)
    for kind, of_kind in groups.items():
        for members in of_kind:
            members = tuple(sorted(members))
            handle = dist.group.WORLD if len(members) == world else dist.new_group(list(members))
            if rank in members:
                mine[kind] = (handle, members)
    # END SOLUTION
    return mine


def create_process_groups(layout: RankLayout) -> ParallelGroups:
    """Create every group of the layout (:func:`new_groups`); return the ones this rank
    belongs to. Collective: every rank calls it, with the same layout."""
    if not dist.is_initialized():
        raise RuntimeError("create_process_groups needs an initialised default process group "
                           "(run it inside reference_impl.comm.launcher.launch or under torchrun)")
    if dist.get_world_size() != layout.world_size:
        raise ValueError(f"the layout is for world size {layout.world_size} but the process "
                         f"group has {dist.get_world_size()} ranks")
    made = new_groups(layout.groups)
    mine = {kind.lower(): group for kind, (group, _) in made.items()}
    return ParallelGroups(layout=layout, coordinates=layout.coordinates(dist.get_rank()), **mine)


def members_by_all_reduce(group: dist.ProcessGroup) -> list[int]:
    """The global ranks that an all-reduce over ``group`` sums, increasing, found by doing one
    all-reduce of one int64 (the notebook's check of every group). Every member calls it. What
    can each member put in so that the sum alone names every rank that took part? Worlds of up
    to 63 ranks."""
    world = dist.get_world_size()
    if world > 63:
        raise ValueError(f"a 64-bit sum holds the bits of ranks 0 to 62; this world has {world} "
                         "ranks")
    # BEGIN SOLUTION lab1: members_by_all_reduce (hint: "real groups and their members" in the notebook)
    mask = torch.tensor([1 << dist.get_rank()], dtype=torch.int64, device=current_device())
    dist.all_reduce(mask, group=group)
    return [rank for rank in range(world) if int(mask.item()) >> rank & 1]
    # END SOLUTION


def mesh_dim_names(layout: RankLayout, kind: str = "WORLD") -> tuple[str, ...]:
    """The device-mesh dimensions spanned by a kind of group, in the mesh's own order."""
    return tuple(name for name in rank_mesh(layout)[1] if name in layout.varying(kind))


def device_mesh(layout: RankLayout, device_type: str | None = None) -> DeviceMesh:
    """The layout as a ``DeviceMesh`` of the grid :func:`~reference_impl.comm.groups.rank_mesh`
    (dimensions ``tp``, ``pp``, ``rdp``, and ``cp`` when cp > 1), on ``device_type`` (default:
    the type of this rank's ``current_device()``, "cuda" under NCCL, else "cpu").

    A mesh numbers ranks row-major, last dimension fastest, so its dimensions are the
    layout's axes slowest first: sagemaker gives shape (rdp, tp, pp), megatron (pp, rdp, tp),
    megatron with cp (pp, rdp, cp, tp). Collective: every rank calls it, with the same layout.
    """
    mesh, names = rank_mesh(layout)
    return DeviceMesh(device_type or current_device().type, mesh, mesh_dim_names=names)
