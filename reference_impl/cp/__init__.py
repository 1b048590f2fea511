"""Context parallelism: a long sequence split across ranks, attention computed over all of it.
The online-softmax merge of partial attention results, the load-balanced causal layout, ring
attention (K/V blocks passed round the CP group, overlapped with compute) and the all-gather
variant of Llama 3, their costs, and the attention layer of a CP rank.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "online_softmax": ["block_attention", "block_attention_backward", "merge_partials",
        "visible_keys"],
    "load_balance": ["check_sequence", "shard_sequence", "token_positions", "unshard_sequence",
        "visible_part"],
    "ring_attention": ["RingAttention", "ring_attention"],
    "ring_overlap": ["RingClock"],
    "allgather_attention": ["AllGatherAttention", "allgather_attention"],
    "cp_costs": ["allgather_attention_bytes", "attention_activation_bytes", "kv_block_bytes",
        "ring_attention_bytes"],
    "cp_attention": ["ContextParallelAttention", "sync_context_parallel_grads"],
})
