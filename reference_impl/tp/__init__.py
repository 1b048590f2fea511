"""Tensor parallelism (labs 2 and 3): Megatron's conjugate collectives, column- and row-parallel
linear layers, TP attention and block, the SageMaker distributed linear, vocabulary and
sequence parallelism, and the same layers built with PyTorch's DTensor for cross-checks.
Figures: ``tp_figures``.
"""
from reference_impl.tp.tp_collectives import (
    copy_to_tp, gather_from_sp, gather_from_tp, reduce_from_tp, reduce_scatter_to_sp,
    scatter_to_tp)
from reference_impl.tp.tp_layers import (
    ColumnParallelLinear, ParallelMLP, RowParallelLinear, full_state, shard, unshard)
from reference_impl.tp.tp_attention import ParallelBlock, ParallelSelfAttention
from reference_impl.tp.sagemaker_linear import DistributedLinear
from reference_impl.tp.vocab_parallel import (
    ParallelLMHead, VocabParallelEmbedding, vocab_parallel_cross_entropy)
from reference_impl.tp.sequence_parallel import SequenceParallelBlock, sync_sequence_parallel_grads

__all__ = [
    "copy_to_tp",
    "gather_from_sp",
    "gather_from_tp",
    "reduce_from_tp",
    "reduce_scatter_to_sp",
    "scatter_to_tp",
    "ColumnParallelLinear",
    "ParallelMLP",
    "RowParallelLinear",
    "full_state",
    "shard",
    "unshard",
    "ParallelBlock",
    "ParallelSelfAttention",
    "DistributedLinear",
    "ParallelLMHead",
    "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy",
    "SequenceParallelBlock",
    "sync_sequence_parallel_grads",
]
