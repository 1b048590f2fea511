"""Lab 3, graded: Megatron tensor-parallel attention and the TP transformer block against the
single-device ones, on tp = 1, 2, 4 and several shapes; and their communication.

Tolerance: fp32, atol 1e-5 on outputs, input gradients, every parameter gradient and every
weight after an SGD step (observed: at most a few 1e-6); the course notes "Week 15 - Tensor
Parallelism and Pipeline Parallelism" ask for 1e-3 at most.
"""
import pytest
import torch

from reference_impl.comm.comm_trace import CommTracer
from reference_impl.equivalence import assert_equivalent, one_step_pairs
from reference_impl.comm.launcher import current_device
from reference_impl.model import Block, CausalSelfAttention, ModelConfig

pytestmark = pytest.mark.lab3

ATOL = 1e-5
SHAPES = [  # (hidden, heads, seq, batch)
    (16, 4, 8, 2),
    (32, 8, 5, 3),
]


def attention_pairs(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    attention = CausalSelfAttention(hidden, heads).to(device)
    parallel = impl.module("tp_attention").ParallelSelfAttention(attention)
    return one_step_pairs(attention, parallel, torch.randn(batch, seq, hidden).to(device))


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-heads{}-seq{}-b{}".format(*s))
def test_tp_attention_matches_single_device(impl, run_on_ranks, world_size, shape):
    assert_equivalent(run_on_ranks(attention_pairs, world_size, impl, *shape), atol=ATOL)


def block_pairs(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    block = Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device)
    parallel = impl.module("tp_attention").ParallelBlock(block)
    return one_step_pairs(block, parallel, torch.randn(batch, seq, hidden).to(device))


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-heads{}-seq{}-b{}".format(*s))
def test_tp_block_matches_single_device(impl, run_on_ranks, world_size, shape):
    assert_equivalent(run_on_ranks(block_pairs, world_size, impl, *shape), atol=ATOL)


def block_collectives(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    block = impl.module("tp_attention").ParallelBlock(
        Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device))
    x = torch.randn(batch, seq, hidden).to(device).requires_grad_()
    with CommTracer() as forward:
        y = block(x)
    with CommTracer() as backward:
        y.sum().backward()
    return [(trace.summary(), trace.total_bytes("all_reduce")) for trace in (forward, backward)]


def test_tp_block_does_two_all_reduces_each_way_of_the_activation_size(impl, run_on_ranks):
    hidden, heads, seq, batch = 16, 4, 8, 2
    activation_bytes = batch * seq * hidden * 4  # fp32: b * s * h * 4 bytes
    results = run_on_ranks(block_collectives, 2, impl, hidden, heads, seq, batch)
    for rank, passes in enumerate(results):
        for direction, (summary, nbytes) in zip(("forward", "backward"), passes):
            assert summary == {"all_reduce": 2}, (
                f"rank {rank}: the TP block's {direction} ran {summary}; Megatron's runs 2 "
                "all-reduces (attention and MLP) and nothing else")
            assert nbytes == 2 * activation_bytes, (
                f"rank {rank}: the {direction} all-reduced {nbytes} bytes; the formula gives "
                f"2 x b*s*h*4 = {2 * activation_bytes}")
