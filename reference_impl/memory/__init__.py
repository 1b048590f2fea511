"""Memory: what autograd saves for the backward, measured and counted (Korthikanti et al.
2022), activation recomputation, full and selective, and the model states' bytes per parameter
under ZeRO (Rajbhandari et al. 2020).
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "activation_memory": ["SavedActivations", "gpt_activation_bytes",
        "model_activation_bytes", "saved_activation_bytes"],
    "recompute": ["recompute"],
    "model_states": ["BYTES_PER_PARAMETER", "zero_memory_formula"],
})
