"""The layout of a parallel run, at the bottom of the library: its sizes (dp replicas x tp x cp
x pp ranks; ep ranks of a replica group sharing each MoE block's experts) and rank order,
checked once, and what it builds on the ranks: the rank layout, the process groups, a
``DeviceMesh`` over them and the expert-parallel groups, in one :class:`ParallelContext` that
every parallel module takes its groups from (the shape of torchtitan's ``ParallelDims``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from reference_impl.comm.device import current_device
from reference_impl.comm.expert_groups import (ExpertGroups, check_expert_parallel,
                                               create_expert_groups, experts_of_rank)
from reference_impl.comm.groups import (RankCoordinates, RankLayout, build_rank_layout,
                                        parse_order, rank_mesh)
from reference_impl.comm.process_groups import ParallelGroups, create_process_groups


def check_expert_split(experts: int | None, ep: int, dp: int, model: str = "the model") -> None:
    """EP groups are cut from the replicas (an EP rank is a replica for everything but the
    experts) and each EP rank holds experts / ep of them: ``ep`` divides ``dp`` and the
    ``experts`` (None: the model is not known yet), lab 9's rules (``expert_groups``)."""
    if ep == 1:
        return
    if experts == 0:
        raise ValueError(f"ep {ep} needs a mixture-of-experts model; {model} is dense")
    check_expert_parallel(dp, ep)
    if experts:
        experts_of_rank(experts, ep, 0)  # refuses experts that ep does not divide


@dataclass(frozen=True)
class ParallelDims:
    """The sizes and the rank order of a layout, refused with the rule when made."""

    dp: int = 1  # model replicas (RDP_GROUP size)
    tp: int = 1
    pp: int = 1
    cp: int = 1  # ranks sharing each sequence (CP_GROUP size)
    ep: int = 1  # ranks of a replica group sharing each MoE block's experts
    order: str = "megatron"  # groups.ORDERS, or a permutation of tp, pp, rdp

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        parse_order(self.order)
        check_expert_split(None, self.ep, self.dp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    def describe(self) -> str:
        parts = [f"dp {self.dp}", f"tp {self.tp}"] + ([f"cp {self.cp}"] if self.cp > 1 else [])
        return " x ".join(parts + [f"pp {self.pp}"]) + f" = {self.world_size} ranks"

    def build(self) -> ParallelContext:
        """Lay out the ranks and create their groups (collective: every rank calls it)."""
        if not dist.is_initialized():
            raise RuntimeError("ParallelDims.build needs an initialised default process group "
                               "(run it inside reference_impl.comm.launcher.launch or under "
                               "torchrun)")
        if dist.get_world_size() != self.world_size:
            raise ValueError(f"{self.describe()}, but there are {dist.get_world_size()} ranks")
        layout = build_rank_layout(self.world_size, self.tp, self.pp, self.order, cp=self.cp)
        groups = create_process_groups(layout)
        grid, names = rank_mesh(layout)  # a mesh over the groups just made: no new groups
        mesh = DeviceMesh.from_group([getattr(groups, name) for name in names],
                                     current_device().type, mesh=grid, mesh_dim_names=names)
        experts = (create_expert_groups(self.ep, layout.groups["RDP"]) if self.ep > 1
                   else None)  # EP groups cut from every replica group
        return ParallelContext(self, layout, groups, mesh, experts)


@dataclass(frozen=True)
class ParallelContext:
    """The layout, this rank's process groups and coordinates, the device mesh, and with ep > 1
    the expert-parallel groups."""

    dims: ParallelDims
    layout: RankLayout
    groups: ParallelGroups
    mesh: DeviceMesh  # dimensions named tp, pp, rdp (and cp), slowest first
    experts: ExpertGroups | None = None  # with ep > 1: this rank's DP, EP and EDP groups

    dp = property(lambda self: self.dims.dp)
    tp = property(lambda self: self.dims.tp)
    pp = property(lambda self: self.dims.pp)
    cp = property(lambda self: self.dims.cp)

    @property
    def coordinates(self) -> RankCoordinates:
        return self.groups.coordinates

    @property
    def replica(self) -> int:
        """Which slice of the global batch this rank's replica trains on: its rdp_rank."""
        return self.coordinates.rdp_rank

    def replica_mesh(self) -> DeviceMesh:
        """The 1-D mesh of the ranks that reduce gradients together: RDP, or RDP x CP."""
        if self.cp == 1:
            return self.mesh["rdp"]
        return DeviceMesh.from_group(self.groups.rdp_cp, self.mesh.device_type)

    def describe(self) -> str:
        cp = f"cp_rank {self.coordinates.cp_rank} of {self.cp}, " if self.cp > 1 else ""
        return (f"rank {self.coordinates.rank}: replica {self.replica} of {self.dp}, "
                f"tp_rank {self.coordinates.tp_rank} of {self.tp}, {cp}"
                f"stage {self.coordinates.pp_rank} of {self.pp}")
