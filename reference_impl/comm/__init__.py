"""How ranks start, talk and are grouped.

Where a rank computes (``device``), the launcher (ranks on CPU or GPU, under the kit or
torchrun; what travels to and from the ranks in ``rank_payloads``, how they fail in
``rank_failures``), the ring collectives and the alpha-beta cost model (lab 0), a tracer of
every collective, a mean of gradients over a group (``mean_all_reduce``), rank layouts and
their process groups (lab 1), expert-parallel groups (lab 9), and a run's layout
(``parallel_dims``). Their figures are in ``reference_impl.figures``.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "device": ["current_device", "wait_for_device"],
    "launcher": ["launch"],
    "rank_failures": ["LaunchTimeout", "RankFailure"],
    "comm_trace": ["CommTracer"],
    "groups": ["RankCoordinates", "RankLayout", "build_rank_layout"],
    "process_groups": ["ParallelGroups", "create_process_groups", "device_mesh"],
    "expert_groups": ["ExpertGroups", "create_expert_groups", "expert_parallel_groups",
                      "experts_of_rank"],
    "parallel_dims": ["ParallelDims", "ParallelContext"],
})
