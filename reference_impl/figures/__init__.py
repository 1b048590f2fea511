"""The course's figures, one module per family, all drawn in the colours and conventions of
``style``: each function returns a matplotlib ``Figure`` (not pyplot), so a notebook shows it
and a script saves it.

Collectives (lab 0): each collective's buffers before and after (``collective_buffers``), the
ring all-reduce step by step (``ring_all_reduce``), the alpha-beta fit (``all_reduce_fit``),
a node's links (``node_topology``). Rank layouts (labs 1, 5): the groups (``rank_groups``) and
the layout on nodes (``node_mesh``). Tensor parallelism (labs 2, 3): ``tensor_parallel``.
Pipelines (lab 4): Gantt charts and Perfetto traces (``pipeline_gantt``). ZeRO (lab 5):
``zero_partitions``. Profiles (lab 6): a merged trace's timeline (``trace_timeline``), the
scaling efficiencies and the communication measured against its prediction (``scaling``).
Context parallelism (lab 8): the ring's steps, the causal mask in chunks, the traffic
(``context_parallel``).
Experts (lab 9): the dispatch and combine, the EP and EDP groups, the load per expert
(``experts``).
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
