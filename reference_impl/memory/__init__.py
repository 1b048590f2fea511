"""Activation memory: what autograd saves for the backward, measured and counted (Korthikanti
et al. 2022), and activation recomputation, full and selective.
"""
from reference_impl.memory.activation_memory import (
    SavedActivations, activation_memory_formula, gpt_activation_bytes, model_activation_bytes,
    saved_activation_bytes)
from reference_impl.memory.recompute import recompute

__all__ = [
    "SavedActivations",
    "activation_memory_formula",
    "gpt_activation_bytes",
    "model_activation_bytes",
    "saved_activation_bytes",
    "recompute",
]
