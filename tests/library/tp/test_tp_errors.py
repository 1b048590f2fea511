"""Tensor-parallel layers refuse shapes they cannot split, naming the numbers."""
import pytest
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.model import Block, CausalSelfAttention, ModelConfig
from reference_impl.tp.tp_attention import ParallelBlock, ParallelSelfAttention
from reference_impl.tp.tp_layers import ColumnParallelLinear, RowParallelLinear


def build_error(build):
    try:
        build()
    except ValueError as error:
        return str(error)
    return None


def column_of_6_outputs():
    return ColumnParallelLinear(nn.Linear(4, 6).to(current_device()))


def column_of_10_outputs_in_3_blocks():
    return ColumnParallelLinear(nn.Linear(4, 10).to(current_device()), blocks=3)


def row_of_6_inputs():
    return RowParallelLinear(nn.Linear(6, 4).to(current_device()))


def attention_of_2_heads():
    return ParallelSelfAttention(CausalSelfAttention(8, 2).to(current_device()))


def block_of_hidden_6():
    return ParallelBlock(Block(ModelConfig(hidden=6, heads=2, seq_len=4)).to(current_device()))


@pytest.mark.parametrize("build, message", [
    (column_of_6_outputs, "output features 6 is not divisible by the tensor-parallel size tp = 4"),
    (column_of_10_outputs_in_3_blocks,
     "output features 10 are not made of 3 equal blocks: 10 is not divisible by 3"),
    (row_of_6_inputs, "input features 6 is not divisible by the tensor-parallel size tp = 4"),
    (attention_of_2_heads, "heads 2 is not divisible by the tensor-parallel size tp = 4"),
    (block_of_hidden_6, "hidden size 6 is not divisible by the tensor-parallel size tp = 4"),
])
def test_shapes_that_do_not_split_over_tp_are_refused(run_on_ranks, build, message):
    for rank, error in enumerate(run_on_ranks(build_error, 4, build)):
        assert error == message, f"rank {rank}: {error!r}"


def test_single_device_attention_refuses_hidden_not_divisible_by_heads():
    with pytest.raises(ValueError, match="hidden size 10 is not divisible by heads = 4"):
        CausalSelfAttention(10, 4)
