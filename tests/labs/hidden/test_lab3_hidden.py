"""Lab 3, hidden checks: the public checks' functions on other shapes, worlds, seeds, group
layouts and vocabularies, with the same messages."""
import pytest
import torch

from test_lab3_tp_attention import check_attention, check_attention_on_layouts, check_block
from test_lab3_vocab_parallel import check_embedding, check_gradients, check_losses, layouts

pytestmark = pytest.mark.lab3

SEEDS = (101, 202)
OTHER_CASES = {  # name: (vocab, scale of the logits, dtype, vocab_size argument)
    "padded": (11, 2.0, torch.float32, 11),
    "large": (20, 150.0, torch.float32, None),
    "bf16": (17, 4.0, torch.bfloat16, 17),
}


@pytest.mark.parametrize("world_size, shape", [(2, (32, 8, 5, 3)), (3, (24, 6, 7, 2)),
                                               (4, (32, 8, 5, 3))])
def test_attention_and_block_on_other_shapes(impl, run_on_ranks, world_size, shape):
    check_attention(run_on_ranks, impl, world_size, shape)
    check_block(run_on_ranks, impl, world_size, shape)


@pytest.mark.parametrize("tp", [2, 4])
def test_attention_and_block_on_other_layouts_and_shapes(impl, run_on_ranks, tp):
    check_attention_on_layouts(run_on_ranks, impl, tp, SEEDS[0], (8, 4, 6, 3))


def test_vocab_parallel_on_the_world_of_four(impl, run_on_ranks):
    check_losses(run_on_ranks, impl, layouts(SEEDS[0], tp=4), OTHER_CASES)
    check_gradients(run_on_ranks, impl, layouts(SEEDS[0], tp=4), OTHER_CASES)
    check_embedding(run_on_ranks, impl, layouts(SEEDS[0], tp=4))


def test_vocab_parallel_on_other_vocabularies(impl, run_on_ranks):
    check_losses(run_on_ranks, impl, layouts(SEEDS[1]), OTHER_CASES)
    check_gradients(run_on_ranks, impl, layouts(SEEDS[1]), OTHER_CASES)
