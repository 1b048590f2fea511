# Student file for the labs, generated from reference_impl/comm/process_groups.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Turn a :class:`~groups.RankLayout` into real ``torch.distributed`` groups.

The thin last step after the pure layout (``groups.py``): call it on every rank, after the
default process group is initialised (the launcher does that), with the same layout.

    layout = build_rank_layout(dist.get_world_size(), tp=2, pp=2)
    groups = create_process_groups(layout)
    dist.all_reduce(grad, group=groups.rdp)

The same layout is also a ``DeviceMesh`` (:func:`device_mesh`), PyTorch's own description of
a multi-dimensional rank grid: its ``tp``, ``pp`` and ``rdp`` dimensions (and ``cp``) are
exactly the TP, PP and RDP (and CP) groups, and the groups of several axes (DP, MP, RDP_CP)
its sub-meshes.

With context parallelism (a layout with cp > 1) there are two more groups, ``cp`` and
``rdp_cp``; without it they are None, and :attr:`ParallelGroups.rdp_cp_or_rdp` is the RDP
group: the group gradients are averaged over either way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from groups import RankCoordinates, RankLayout
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


def create_process_groups(layout: RankLayout) -> ParallelGroups:
    """Create every group of the layout; return the ones this rank belongs to.

    ``dist.new_group`` is collective: every rank creates every group, in the same order,
    including the groups it is not a member of.
    """
    if not dist.is_initialized():
        raise RuntimeError("create_process_groups needs an initialised default process group "
                           "(run it inside reference_impl.comm.launcher.launch or under torchrun)")
    if dist.get_world_size() != layout.world_size:
        raise ValueError(f"the layout is for world size {layout.world_size} but the process "
                         f"group has {dist.get_world_size()} ranks")
    rank = dist.get_rank()
    mine = {}
    raise NotImplementedError('lab1: create every group of every kind with dist.new_group (all ranks, same order; WORLD is dist.group.WORLD) and keep this rank\'s in mine["tp"], mine["pp"], ... (keys: kind.lower())')
    return ParallelGroups(layout=layout, coordinates=layout.coordinates(rank), **mine)


def mesh_dim_names(layout: RankLayout, kind: str = "WORLD") -> tuple[str, ...]:
    """The device-mesh dimensions spanned by a kind of group, in the mesh's own order."""
    return tuple(axis for axis in reversed(layout.axes) if axis in layout.varying(kind))


def device_mesh(layout: RankLayout, device_type: str | None = None) -> DeviceMesh:
    """The layout as a 3-D ``DeviceMesh`` named ``tp``, ``pp``, ``rdp`` (4-D with ``cp`` when
    cp > 1), on ``device_type`` (default: the type of this rank's ``current_device()``, "cuda"
    under NCCL, else "cpu").

    A mesh numbers ranks row-major, last dimension fastest, so its dimensions are the
    layout's axes slowest first: sagemaker gives shape (rdp, tp, pp), megatron (pp, rdp, tp),
    megatron with cp (pp, rdp, cp, tp).
    """
    names = mesh_dim_names(layout)
    device_type = device_type or current_device().type
    sizes = {"tp": layout.tp, "pp": layout.pp, "rdp": layout.rdp, "cp": layout.cp}
    return init_device_mesh(device_type, tuple(sizes[name] for name in names),
                            mesh_dim_names=names)
