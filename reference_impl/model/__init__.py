"""The single-device model, every parallel component's oracle: the course's GPT and its
Llama-style options (``gpt.py``), the attention core (``attention.py``), rotary positions,
the Llama parts, mixed precision, master weights, the fused linear cross-entropy, and text
sampled from a trained GPT (``sampling.py``).
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "gpt": ["GPT", "Block", "MLP", "CausalSelfAttention", "ModelConfig", "llama_config",
            "llama_ffn_hidden", "make_attention", "make_mlp", "make_norm", "MLPS", "NORMS",
            "POSITIONS", "SWIGLU_FFN_MULTIPLE_OF"],
    "attention": ["ATTENTION_KERNELS", "attention_core", "causal_attention", "check_attention",
                  "check_kv_heads", "merge_heads", "repeat_kv_heads", "split_heads"],
})
