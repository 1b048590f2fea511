"""3D parallelism (``hybrid.py``) and its gradient synchronisation (``data_parallel.py``),
against single-device training of the same GPT on the same global batches.

Layouts are written **dp x tp x pp** (``initialize_parallelism(dp, tp, pp)``; dp = model
replicas = RDP_GROUP size), all on 8 CPU ranks: 2x2x2, 1x2x4, 2x1x4, 4x2x1, 1x1x8. The model
is tiny (hidden 16, 2 heads, seq 8, vocab 32; 2 blocks, 6 for pp=8, which needs 8 layers).

Tolerances (fp32): TP, PP and DP change only the order of additions, so every step's loss and
the final weights agree to atol 1e-5 (observed: at most 5e-7 for the losses, 3e-7 for the
weights, which the optimizer moved by at least 5e-3 per tensor); the bucketed all-reduce sums the
same numbers as the unbucketed one, to atol 1e-6.
"""
import copy

import pytest
import torch
import torch.distributed as dist

from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.checks import assert_close
from reference_impl.hybrid.data_parallel import all_reduce_mean, gradient_plan, sync_gradients
from reference_impl.comm.groups import build_rank_layout
from reference_impl.comm.device import current_device
from reference_impl.model import GPT, ModelConfig
from reference_impl.comm.process_groups import create_process_groups
from reference_impl.tp.sagemaker_linear import DistributedLinear
from reference_impl.tp.tp_layers import unshard
from reference_impl.toys import toy_and_batch, toy_grads, toy_loss

ATOL = 1e-5
WORLD = 8
STEPS, BATCH, SEQ, VOCAB = 3, 8, 8, 32
TIMEOUT = 120  # 8 ranks on 2 cores: one launch takes ~2 s, far from this


def tiny_gpt(pp: int) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=VOCAB, seq_len=SEQ, hidden=16, heads=2,
                           layers=max(2, pp - 2)))


def make_optimizer(name):
    if name == "adam":
        # eps 1e-4, not 1e-8: the key bias's gradient is 0 in exact arithmetic (softmax ignores
        # a constant per query row) and ~1e-9 of rounding noise in fp32, which Adam with a tiny
        # eps would turn into lr-sized steps of either sign on either side.
        return lambda parameters: torch.optim.Adam(parameters, lr=1e-2, eps=1e-4)
    return lambda parameters: torch.optim.SGD(parameters, lr=0.5, momentum=0.9)


def train_3d(gpt, dataset, dp, tp, pp, order, schedule, chunks, optimizer, convention):
    context = hybrid.initialize_parallelism(dp, tp, pp, order=order)
    model = hybrid.build_3d_gpt(gpt, context, microbatches=2, schedule=schedule, chunks=chunks)
    optim = make_optimizer(optimizer)(model.parameters())
    losses = [hybrid.train_step(model, tokens, targets, optim, convention=convention)
              for tokens, targets in dataset]
    return losses, hybrid.gather_full_state(model)


LAYOUTS = [  # dp, tp, pp, rank order, schedule, chunks, optimizer
    (2, 2, 2, "megatron", "1f1b", 1, "sgd"),
    (2, 2, 2, "sagemaker", "gpipe", 1, "adam"),
    (1, 2, 4, "megatron", "1f1b", 1, "sgd"),
    (2, 1, 4, "megatron", "zb-h1", 1, "sgd"),
    (4, 2, 1, "megatron", "1f1b", 1, "adam"),
    (1, 1, 8, "megatron", "1f1b", 1, "sgd"),
    (2, 2, 2, "megatron", "interleaved", 2, "sgd"),
]


@pytest.mark.parametrize("dp, tp, pp, order, schedule, chunks, optimizer", LAYOUTS,
                         ids=[f"{d}x{t}x{p}-{o}-{s}-{opt}" for d, t, p, o, s, _, opt in LAYOUTS])
def test_3d_training_matches_single_device(run_on_ranks, dp, tp, pp, order, schedule, chunks,
                                           optimizer):
    gpt = tiny_gpt(pp)
    dataset = hybrid.make_dataset(0, STEPS, BATCH, SEQ, VOCAB)
    results = run_on_ranks(train_3d, WORLD, gpt, dataset, dp, tp, pp, order, schedule, chunks,
                           optimizer, "megatron", timeout=TIMEOUT)
    losses, state = hybrid.train_single_device(gpt, dataset, make_optimizer(optimizer))
    initial = dict(gpt.named_parameters())
    for rank, (rank_losses, rank_state) in enumerate(results):
        assert_close(torch.tensor(rank_losses), torch.tensor(losses),
                     f"the loss of steps 1..{STEPS} ({dp}x{tp}x{pp})", rank=rank, atol=ATOL,
                     likely_cause="each replica must train on its own slice of the global batch "
                                  "and the gradients be averaged over RDP_GROUP")
        assert set(rank_state) == set(state), f"rank {rank}: parameter names differ"
        for name, expected in state.items():
            change = (expected - initial[name].detach()).abs().max().item()
            assert change > 100 * ATOL, f"{name} moved by {change:.2g} only: a weak test"
            assert_close(rank_state[name], expected, f"{name} after {STEPS} steps", rank=rank,
                         atol=ATOL, likely_cause="its gradient was reduced over the wrong group "
                                                 "or divided by the wrong count")


def first_step_state(gpt, dataset, convention):
    context = hybrid.initialize_parallelism(2, 2, 2)
    model = hybrid.build_3d_gpt(gpt, context, microbatches=2)
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    result = hybrid.train_step(model, *dataset[0], optim, convention=convention,
                               return_report=True)
    return result.sync, hybrid.gather_full_state(model)


def test_sagemaker_rule_on_megatron_data_layout_shrinks_sharded_gradients(run_on_ranks):
    """Megatron layout (TP peers see the same samples): SageMaker's rule averages a sharded
    gradient over RDP but divides by the DP group's size: tp times too small. The replicated
    ones come out right (tp identical copies summed, divided by tp more)."""
    gpt = tiny_gpt(2)
    dataset = hybrid.make_dataset(0, 1, BATCH, SEQ, VOCAB)
    _, expected = hybrid.train_single_device(gpt, dataset,
                                             lambda p: torch.optim.SGD(p, lr=1.0))
    right = run_on_ranks(first_step_state, WORLD, gpt, dataset, "megatron", timeout=TIMEOUT)
    wrong = run_on_ranks(first_step_state, WORLD, gpt, dataset, "sagemaker", timeout=TIMEOUT)
    report, state = right[0]
    assert report.all_reduces == {"RDP": 1, "DP": 0}, "one bucket, all of it over RDP_GROUP"
    for name in expected:
        assert_close(state[name], expected[name], name, rank=0, atol=ATOL)
    _, state = wrong[0]
    assert_close(state["blocks.0.ln1.weight"], expected["blocks.0.ln1.weight"], "ln1", atol=ATOL)
    with pytest.raises(AssertionError, match="tp times too small"):
        assert_close(state["blocks.0.attn.qkv.weight"], expected["blocks.0.attn.qkv.weight"],
                     "blocks.0.attn.qkv.weight after one step", rank=0, atol=ATOL,
                     likely_cause="sum over RDP_GROUP divided by the DP_GROUP size: tp times "
                                  "too small, as the TP peers hold the same samples")


# ----------------------------- SageMaker's data layout ("How Tensor Parallelism Works")

def sagemaker_toy_grads(variant, bucket_bytes=None):
    """4 ranks, tp=2, SageMaker layout: every DP rank holds its own 2 samples; the fc layer is
    a DistributedLinear over the TP group (it gathers the TP group's samples)."""
    device = current_device()
    layout = build_rank_layout(4, tp=2, pp=1, order="sagemaker")
    groups = create_process_groups(layout)
    toy, tokens, targets = toy_and_batch()
    toy, tokens, targets = toy.to(device), tokens.to(device), targets.to(device)
    model = copy.deepcopy(toy)
    model.fc = DistributedLinear(toy.fc, groups.tp)
    shard = slice(groups.coordinates.dp_rank * 2, groups.coordinates.dp_rank * 2 + 2)
    toy_loss(model, tokens[shard], targets[shard]).backward()
    counts = None
    if variant == "sagemaker-rule":
        counts = sync_gradients(model, groups, "sagemaker", bucket_bytes).all_reduces
    elif variant == "replicated-over-rdp":  # the mistake: every gradient over RDP only
        plan = gradient_plan(model, "sagemaker")
        grads = [p.grad for _, p in plan["RDP"] + plan["DP"]]
        all_reduce_mean(grads, groups.rdp, dist.get_world_size(groups.dp), bucket_bytes)
    return counts, {name: unshard(p.grad, p, groups.tp) for name, p in model.named_parameters()}


WRONG_GROUP = ("reduced over RDP_GROUP but it is replicated across the TP group, whose ranks "
               "hold other samples: SageMaker's rule all-reduces it over the whole DP_GROUP")


def test_sagemaker_layout_needs_dp_group_for_replicated_parameters(run_on_ranks):
    expected = toy_grads()
    right = run_on_ranks(sagemaker_toy_grads, 4, "sagemaker-rule", timeout=TIMEOUT)
    wrong = run_on_ranks(sagemaker_toy_grads, 4, "replicated-over-rdp", timeout=TIMEOUT)
    for rank, (_, grads) in enumerate(right):
        for name in expected:
            assert_close(grads[name], expected[name], f"{name} grad", rank=rank, atol=1e-6)
    for rank, (_, grads) in enumerate(wrong):
        assert_close(grads["fc.weight"], expected["fc.weight"], "fc.weight grad", rank=rank,
                     atol=1e-6, likely_cause="a distributed parameter belongs on RDP_GROUP")
        for name in ("embedding.weight", "ln.weight", "head.weight"):
            with pytest.raises(AssertionError, match="reduced over RDP_GROUP but it is "
                                                     "replicated across the TP group"):
                assert_close(grads[name], expected[name], f"{name.split('.')[0]} grad",
                             rank=rank, atol=1e-6, likely_cause=WRONG_GROUP)


@pytest.mark.parametrize("bucket_bytes, rdp_reduces, dp_reduces", [
    # RDP: fc.weight 512 B, fc.bias 64 B (the shards); DP: embedding 2048 B, ln.weight 64 B, ln.bias 64 B,
    # mlp.fc1 2048 B + 128 B, mlp.fc2 2048 B + 64 B, head.weight 2048 B, head.bias 128 B
    (None, 2, 9),   # unbucketed: one all-reduce per parameter
    (256, 2, 8),    # ln.weight + ln.bias share a bucket; every other tensor needs its own
    (4096, 1, 4),   # [embedding, ln], [fc1], [fc2], [head]: a weight and the next do not fit
    (2**20, 1, 1),  # one bucket per group
])
def test_bucketed_all_reduce_matches_unbucketed(run_on_ranks, bucket_bytes, rdp_reduces,
                                                dp_reduces):
    expected = toy_grads()
    bucketed = run_on_ranks(sagemaker_toy_grads, 4, "sagemaker-rule", bucket_bytes, timeout=TIMEOUT)
    for rank, (counts, grads) in enumerate(bucketed):
        assert counts == {"RDP": rdp_reduces, "DP": dp_reduces}, \
            f"rank {rank}: all-reduces per group {counts}, expected RDP {rdp_reduces}, " \
            f"DP {dp_reduces} for {bucket_bytes} B buckets"
        for name in expected:
            assert_close(grads[name], expected[name], f"{name} grad ({bucket_bytes} B buckets)",
                         rank=rank, atol=1e-6)
