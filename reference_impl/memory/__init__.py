"""Activation memory: what autograd saves for the backward, measured and counted (Korthikanti
et al. 2022), and activation recomputation, full and selective.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "activation_memory": ["SavedActivations", "activation_memory_formula", "gpt_activation_bytes",
        "model_activation_bytes", "saved_activation_bytes"],
    "recompute": ["recompute"],
})
