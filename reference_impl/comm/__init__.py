"""How ranks start, talk and are grouped.

The launcher (ranks on CPU or GPU, under the kit or torchrun), the ring collectives and the
alpha-beta cost model (lab 0), a tracer of every collective, rank layouts and their process
groups (lab 1). Figures: ``collectives_figure``, ``alpha_beta_figure``, ``groups_figure``.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "launcher": ["LaunchTimeout", "RankFailure", "current_device", "launch", "wait_for_device"],
    "comm_trace": ["CommTracer"],
    "groups": ["RankCoordinates", "RankLayout", "build_rank_layout"],
    "process_groups": ["ParallelGroups", "create_process_groups", "device_mesh"],
})
