"""The course's figures, one module per family, all in ``style``'s colours and conventions; each
function returns a matplotlib ``Figure`` (not pyplot), so a notebook shows it and a script saves it.

Lab 0: ``collective_buffers``, ``ring_all_reduce``, ``all_reduce_fit``, ``node_topology``. Labs
1 and 5: ``rank_groups``, ``node_mesh``, ``zero_partitions``. Labs 2 and 3: ``tensor_parallel``.
Lab 4: ``pipeline_gantt`` (Gantt charts, Perfetto traces). Lab 6: ``trace_timeline``, ``scaling``.
Lab 8: ``context_parallel``. Lab 9: ``experts`` (dispatch and combine, EP and EDP groups, load).
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "collective_buffers": ["collective_states", "plot_collective"],
    "ring_all_reduce": ["plot_ring_all_reduce", "plot_ring_step", "ring_all_reduce_states"],
    "all_reduce_fit": ["plot_all_reduce_fit"],
    "node_topology": ["plot_node_topology"],
    "rank_groups": ["plot_rank_groups"],
    "node_mesh": ["groups_inside_nodes", "plot_node_mesh"],
    "tensor_parallel": ["plot_block_collectives", "plot_distributed_linear", "plot_linear_split",
        "plot_qkv_split"],
    "pipeline_gantt": ["chrome_trace", "in_flight_over_time", "plot_gantt",
        "plot_gantt_with_memory", "save_chrome_trace"],
    "zero_partitions": ["partition_bytes", "plot_zero_partitions"],
    "trace_timeline": ["plot_trace"],
    "scaling": ["plot_scaling"],
    "context_parallel": ["causal_pairs_per_rank", "plot_causal_chunks", "plot_cp_traffic",
        "plot_ring_steps", "ring_holdings"],
    "experts": ["exchange_rows", "plot_expert_groups", "plot_expert_load", "plot_token_exchange"],
})
