"""Mixture of experts and expert parallelism: the top-k router with capacity and the Switch
auxiliary loss, the single-device MoE layer (the oracle), the expert-parallel layer (tokens
dispatched and combined with all-to-alls over the EP groups of ``comm.expert_groups``) and its
gradient sync, and what it costs (all-to-all bytes, load imbalance).
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "router": ["Router", "Routing", "expert_capacity", "switch_aux_loss"],
    "moe_layer": ["MoELayer", "MoEOutput"],
    "token_exchange": ["AllToAllCall", "all_to_all_rows"],
    "expert_parallel": ["ExpertParallelMoE", "sync_moe_grads"],
    "moe_costs": ["AllToAllBytes", "all_to_all_bytes", "load_imbalance", "relative_load",
        "tokens_to_ranks"],
})
