"""How ranks start, talk and are grouped.

The launcher (ranks on CPU or GPU, under the kit or torchrun), the ring collectives and the
alpha-beta cost model (lab 0), a tracer of every collective, rank layouts and their process
groups (lab 1). Figures: ``collectives_figure``, ``alpha_beta_figure``, ``groups_figure``.
"""
from reference_impl.comm.launcher import (
    LaunchTimeout, RankFailure, current_device, launch, wait_for_device)
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.groups import RankCoordinates, RankLayout, build_rank_layout
from reference_impl.comm.process_groups import ParallelGroups, create_process_groups, device_mesh

__all__ = [
    "LaunchTimeout",
    "RankFailure",
    "current_device",
    "launch",
    "wait_for_device",
    "CommTracer",
    "RankCoordinates",
    "RankLayout",
    "build_rank_layout",
    "ParallelGroups",
    "create_process_groups",
    "device_mesh",
]
