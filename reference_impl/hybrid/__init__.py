"""Data parallelism and its combinations (lab 5): which group each gradient is averaged over,
DDP from backward hooks (async bucketed all-reduces overlapping the backward),
ZeRO stages 1-3, the 3D-parallel GPT (dp x tp x pp) and layout-independent checkpoints.
"""
from reference_impl.hybrid.data_parallel import GradientSync, gradient_plan, sync_gradients
from reference_impl.hybrid.ddp_hooks import OverlappingDataParallel
from reference_impl.hybrid.zero import ZeroOptimizer, model_state_bytes, zero_memory_formula
from reference_impl.hybrid.parallel_3d import (
    ParallelContext, build_3d_gpt, gather_full_state, initialize_parallelism, make_dataset,
    train_single_device, train_step)

__all__ = [
    "GradientSync",
    "gradient_plan",
    "sync_gradients",
    "OverlappingDataParallel",
    "ZeroOptimizer",
    "model_state_bytes",
    "zero_memory_formula",
    "ParallelContext",
    "build_3d_gpt",
    "gather_full_state",
    "initialize_parallelism",
    "make_dataset",
    "train_single_device",
    "train_step",
]
