"""Tensor parallelism (labs 2 and 3): Megatron's conjugate collectives, column- and row-parallel
linear layers, TP attention and block, the SageMaker distributed linear, vocabulary and
sequence parallelism, and the same layers built with PyTorch's DTensor for cross-checks.
Figures: ``reference_impl.figures.tensor_parallel``.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "tp_collectives": ["copy_to_tp", "gather_from_sp", "gather_from_tp", "reduce_from_tp",
        "reduce_scatter_to_sp", "scatter_to_tp"],
    "tp_layers": ["ColumnParallelLinear", "ParallelMLP", "RowParallelLinear", "full_state",
        "shard", "unshard"],
    "tp_attention": ["ParallelBlock", "ParallelSelfAttention"],
    "sagemaker_linear": ["DistributedLinear"],
    "vocab_parallel": ["ParallelLMHead", "VocabParallelEmbedding", "vocab_parallel_cross_entropy"],
    "sequence_parallel": ["SequenceParallelBlock", "sync_sequence_parallel_grads"],
})
