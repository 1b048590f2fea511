"""Lab 3, graded: Megatron tensor-parallel attention and the TP transformer block against the
single-device ones, on tp = 1, 2, 4 and several shapes; and their communication.

The expected values come from a copy of the single-device module made before the submission is
loaded; the module the submission builds from is checked after its step too, so a parallel
module that shares a parameter with it (the same tensor, not a copy) is caught. A failing output
is matched against what the known mistakes compute (a wrong attention scale, the projection's
bias counted tp times), computed in the same rank from the single-device module.

Tolerance: fp32, atol 1e-5 on outputs, input gradients, every parameter gradient and every
weight after an SGD step (observed: at most a few 1e-6); the course notes "Week 15 - Tensor
Parallelism and Pipeline Parallelism" ask for 1e-3 at most.
"""
import math

import pytest
import torch

from reference_impl.comm.comm_trace import CommTracer
from reference_impl.equivalence import (assert_equivalent, parallel_pairs, parameters_of,
                                        reference_step, source_pairs)
from reference_impl.comm.device import current_device
from reference_impl.model import (Block, CausalSelfAttention, ModelConfig, attention_core,
                                  merge_heads, split_heads)

from reference_impl.checks import assert_close_naming

pytestmark = pytest.mark.lab3

ATOL = 1e-5
SHAPES = [  # (hidden, heads, seq, batch)
    (16, 4, 8, 2),
    (32, 8, 5, 3),
]


FORWARD_INHERITED = (
    "ParallelSelfAttention has no forward of its own: the single-device "
    "CausalSelfAttention.forward it inherits runs instead. Write it for this rank's heads")


def scale_mistakes(attention, x, tp):
    """What the single-device attention computes with a wrong scale in place of 1/sqrt(d)."""
    d = attention.qkv.in_features // attention.heads

    def output(scale):
        with torch.no_grad():
            q, k, v = split_heads(attention.qkv(x), attention.heads)
            core = attention_core(q * scale * math.sqrt(d), k, v, attention.attention)
            return attention.proj(merge_heads(core))

    hidden = attention.qkv.in_features
    return {f"the attention scale is 1/sqrt(h/tp) = 1/sqrt({hidden // tp}), this rank's width; "
            f"it is 1/sqrt(d) = 1/sqrt({d}), d the size of one head": output(
                1 / math.sqrt(hidden // tp)),
            f"the attention scale is 1/sqrt(h) = 1/sqrt({hidden}), the whole width; it is "
            f"1/sqrt(d) = 1/sqrt({d}), d the size of one head": output(1 / math.sqrt(hidden)),
            "the attention scores are not scaled: softmax(q k^T / sqrt(d)), d the size of one "
            "head": output(1.0)}


def attention_pairs(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    attention = CausalSelfAttention(hidden, heads).to(device)
    x = torch.randn(batch, seq, hidden).to(device)
    tp = torch.distributed.get_world_size()
    expected, before = reference_step(attention, x), parameters_of(attention)
    mistakes = {"output": scale_mistakes(attention, x, tp)}
    with torch.no_grad():
        mistakes["output"][PROJECTION_BIAS_BEFORE_THE_REDUCE] = (
            expected["output"] + (tp - 1) * attention.proj.bias.cpu())
    module = impl.module("tp_attention")
    parallel = module.ParallelSelfAttention(attention)
    pairs = parallel_pairs(parallel, x, expected) + source_pairs(attention, before)
    return pairs, mistakes, "forward" in vars(module.ParallelSelfAttention)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-heads{}-seq{}-b{}".format(*s))
def test_tp_attention_matches_single_device(impl, run_on_ranks, world_size, shape):
    results = run_on_ranks(attention_pairs, world_size, impl, *shape)
    assert_equivalent([pairs for pairs, _, _ in results], atol=ATOL, mistakes=results[0][1])
    assert results[0][2], FORWARD_INHERITED


def block_pairs(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    block = Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device)
    x = torch.randn(batch, seq, hidden).to(device)
    expected, before = reference_step(block, x), parameters_of(block)
    parallel = impl.module("tp_attention").ParallelBlock(block)
    return parallel_pairs(parallel, x, expected) + source_pairs(block, before)


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


CONTIGUOUS_QKV = (
    "the fused QKV weight was split contiguously (tp chunks of the 3h rows): rank 0 then holds "
    "queries where split_heads reads keys and values; each of the q, k and v blocks must be "
    "split on its own (blocks=3), so that a rank holds the q, k and v of the same heads")
EVERY_HEAD = (
    "every head on every rank: a rank must compute heads/tp heads (its own), with the q, k and "
    "v rows of those heads only")
PROJECTION_BIAS_BEFORE_THE_REDUCE = (
    "the output projection's bias was added on every rank before the all-reduce: the sum of "
    "the ranks' partial outputs then counts it tp times; it is added once, after the sum")
PAIRS = [[0, 1], [2, 3]]  # two TP groups of 2 at once, in a world of 4


def attention_on_two_groups(impl, hidden, heads, seq, batch):
    """World of 4, two TP groups of 2 at once: this rank's heads and qkv rows, and the
    attention and the block against their single-device originals, over this rank's group."""
    device, rank = current_device(), torch.distributed.get_rank()
    groups = [torch.distributed.new_group(ranks) for ranks in PAIRS]
    group = groups[rank // 2]
    torch.manual_seed(0)
    attention = CausalSelfAttention(hidden, heads).to(device)
    block = Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(rank // 2))
    x = x.to(device)
    full_qkv = attention.qkv.weight.detach().clone()
    probe = CausalSelfAttention(hidden, heads).to(device)  # a zero projection: output = its bias
    with torch.no_grad():
        probe.proj.weight.zero_()
    probe_bias = probe.proj.bias.detach().clone()
    expected = {"attention": reference_step(attention, x), "block": reference_step(block, x)}
    mistakes = {"output": scale_mistakes(attention, x, len(PAIRS[0]))}

    before = {"attention": parameters_of(attention), "block": parameters_of(block)}

    module = impl.module("tp_attention")
    parallel = module.ParallelSelfAttention(attention, group)
    local_qkv = dict(parallel.named_parameters())["qkv.weight"].detach().clone()
    bias_only = module.ParallelSelfAttention(probe, group)(x).detach()
    parallel_block = module.ParallelBlock(block, group)
    return {"heads": parallel.heads, "qkv": (local_qkv, full_qkv),
            "bias only": (bias_only, probe_bias),
            "attention": parallel_pairs(parallel, x, expected["attention"], group)
            + source_pairs(attention, before["attention"]),
            "block": parallel_pairs(parallel_block, x, expected["block"], group)
            + source_pairs(block, before["block"]),
            "own forward": "forward" in vars(module.ParallelSelfAttention),
            "mistakes": mistakes}


def test_each_rank_computes_its_heads_with_two_groups_at_once(impl, run_on_ranks):
    hidden, heads, tp = 16, 4, 2
    results = run_on_ranks(attention_on_two_groups, 4, impl, hidden, heads, 8, 2)
    assert results[0]["own forward"], FORWARD_INHERITED
    for rank, checks in enumerate(results):
        tp_rank, width = rank % 2, hidden // tp
        assert checks["heads"] == heads // tp, (
            f"rank {rank}: ParallelSelfAttention.heads is {checks['heads']}, this rank computes "
            f"heads/tp = {heads}/{tp} = {heads // tp} heads. Likely cause: {EVERY_HEAD}")
        local, full = checks["qkv"]
        mine = [part * hidden + tp_rank * width + i for part in range(3) for i in range(width)]
        assert_close_naming(
            local, full[mine], "the local qkv.weight", rank=rank, atol=0,
            against="the q, k and v rows of this rank's heads",
            otherwise="rank r holds rows r*h/tp to (r+1)*h/tp of each of q, k and v",
            mistakes={CONTIGUOUS_QKV: full.chunk(tp)[tp_rank], EVERY_HEAD: full})
        output, bias = checks["bias only"]
        assert_close_naming(
            output, bias.expand_as(output), "the output with a zero projection weight",
            rank=rank, atol=ATOL, against="the projection's bias",
            otherwise="with a zero projection weight the output is its bias, once",
            mistakes={PROJECTION_BIAS_BEFORE_THE_REDUCE: tp * bias.expand_as(output)})
    for kind in ("attention", "block"):
        try:
            assert_equivalent([checks[kind] for checks in results], atol=ATOL,
                              mistakes=results[0]["mistakes"] if kind == "attention" else None)
        except AssertionError as failure:
            raise AssertionError(f"{kind}, TP groups [0, 1] and [2, 3] at once: {failure}") from None
