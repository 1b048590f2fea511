"""Data parallelism and its combinations (lab 5): which group each gradient is averaged over,
DDP from backward hooks (async bucketed all-reduces overlapping the backward),
ZeRO stages 1-3, the data-parallel kinds (dp_kinds/, FSDP2 among them), the 3D-parallel GPT
(dp x tp x pp), every technique composed on it (parallelize_gpt) and sharded checkpoints.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "data_parallel": ["GradientSync", "gradient_plan", "sync_gradients"],
    "ddp_hooks": ["OverlappingDataParallel"],
    "zero": ["ZeroOptimizer", "model_state_bytes", "zero_memory_formula"],
    "training_plan": ["TrainingPlan"],
    "dp_kinds.registry": ["KINDS", "kind_of"],
    "parallelize": ["apply_dp", "apply_pp", "apply_recompute", "apply_tp",
        "build_optimizer", "finish_gradients", "parallelize_gpt"],
    "parallel_gpt": ["ParallelContext", "build_3d_gpt", "gather_full_state",
        "initialize_parallelism", "make_dataset", "train_single_device", "train_step"],
})
