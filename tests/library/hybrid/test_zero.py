"""ZeRO stages 1, 2, 3 (reference_impl/hybrid/zero.py) against unsharded ``torch.optim.Adam``.

Each rank trains on its own data; the oracle is one single-device model stepped by
``torch.optim.Adam`` with the gradients averaged over the ranks. Checked: the parameters after
several steps, the model-state bytes each rank holds (exactly the fp32 formula, with each
parameter padded to a multiple of N), which collectives ran, and, for stage 3, that a layer's
parameters are whole only while that layer runs.

Tolerance (fp32): 1e-6 absolute and relative on the parameters after 3 Adam steps at lr 1e-2
(the update is Adam's own arithmetic on each element; only the order of the gradient sum over
ranks differs; observed: at most 6e-8). The models avoid parameters whose gradient is zero in
exact arithmetic (an attention block's key bias: softmax is shift invariant), because Adam
divides such a gradient's rounding noise by its own size and turns it into steps of +-lr;
the Block test therefore compares stage 3's gradient shards, before Adam.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close
from reference_impl.equivalence import train_on_averaged_gradients
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.groups import build_rank_layout
from reference_impl.comm.device import current_device
from reference_impl.model import MLP, Block, ModelConfig
from reference_impl.comm.process_groups import create_process_groups
from reference_impl.tp.tp_layers import ParallelMLP, unshard
from reference_impl.hybrid.zero import (ZeroOptimizer, model_state_bytes, padded_numel,
                                 zero_memory_formula)

HIDDEN, FFN, BATCH, SEQ = 10, 36, 2, 6  # 10 is not a multiple of 4: padding is exercised
STEPS, LR = 3, 1e-2
ATOL = RTOL = 1e-6


def mlp_model() -> nn.Module:
    """Two pre-layernorm MLPs: every parameter's gradient is generically non-zero."""
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(HIDDEN), MLP(HIDDEN, FFN), nn.LayerNorm(HIDDEN),
                         MLP(HIDDEN, FFN))


def batch(step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and upstream gradient of data-parallel replica ``replica`` at ``step``."""
    generator = torch.Generator().manual_seed(1000 * step + replica)
    return (torch.randn(BATCH, SEQ, HIDDEN, generator=generator),
            torch.randn(BATCH, SEQ, HIDDEN, generator=generator))


def reference_adam(model: nn.Module, replicas: int, steps: int = STEPS) -> dict:
    """Unsharded Adam on gradients averaged over the replicas' data."""
    return train_on_averaged_gradients(model, torch.optim.Adam(model.parameters(), lr=LR), steps,
                                       replicas, batch)


def owners(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]


def own_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))


def train_on_rank(stage: int) -> dict:
    device = current_device()
    model = mlp_model().to(device)
    optimizer = ZeroOptimizer(model, stage=stage, lr=LR)
    # Stage 3: while a layer runs, only its own parameters may be whole (this pre-hook runs
    # after ZeRO's, which gathers them).
    while_running = []
    for owner in owners(model):
        owner.register_forward_pre_hook(lambda module, args: while_running.append(
            (model_state_bytes(model)["parameters"], own_bytes(module))))
    result = {"after_forward": [], "after_backward": []}
    for step in range(STEPS):
        x, upstream = (t.to(device) for t in batch(step, dist.get_rank()))
        with CommTracer() as forward:
            y = model(x)
        result["after_forward"].append(model_state_bytes(model)["parameters"])
        with CommTracer() as backward:
            y.backward(upstream)
        result["after_backward"].append(model_state_bytes(model)["parameters"])
        with CommTracer() as step_trace:
            optimizer.step()
        if step == 0:
            result["memory"] = model_state_bytes(model, optimizer)
            result["collectives"] = [t.summary() for t in (forward, backward, step_trace)]
        optimizer.zero_grad()
    result["while_running"] = while_running
    result["state"] = optimizer.full_state_dict()
    return result


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_matches_unsharded_adam(run_on_ranks, stage, world_size):
    results = run_on_ranks(train_on_rank, world_size, stage)
    expected = reference_adam(mlp_model(), world_size)
    model = mlp_model()
    num_params = sum(p.numel() for p in model.parameters())
    padded = padded_numel(model, world_size)
    formula = zero_memory_formula(num_params, world_size, stage, mixed_precision=False,
                                  padded_num_params=padded)
    n_params = len(list(model.parameters()))
    for rank, result in enumerate(results):
        for name, value in expected.items():
            assert_close(result["state"][name], value, f"ZeRO-{stage} parameter {name} after "
                         f"{STEPS} steps", rank=rank, atol=ATOL, rtol=RTOL,
                         against="unsharded torch.optim.Adam on the averaged gradients",
                         likely_cause="a shard updated with the wrong slice of m, v or the "
                                      "gradient, or the gradient summed but not averaged")
        assert result["memory"]["total"] == formula, (
            f"rank {rank}: ZeRO-{stage} holds {result['memory']} bytes of model states; the "
            f"fp32 formula gives {formula} ({num_params} parameters, {padded} after padding "
            f"each to a multiple of N = {world_size})")
        forward, backward, step = result["collectives"]
        if stage == 1:
            assert (forward, backward) == ({}, {}), f"rank {rank}: {forward}, {backward}"
            assert step == {"all_reduce": n_params, "all_gather": n_params}, f"rank {rank}: {step}"
        elif stage == 2:
            # reduce-scatter instead of all-reduce: each rank keeps only its gradient shard
            assert forward == {}, f"rank {rank}: {forward}"
            assert backward == {"reduce_scatter": n_params}, f"rank {rank}: {backward}"
            assert step == {"all_gather": n_params}, f"rank {rank}: {step}"
        else:
            # gathered for the forward, again for the backward; no all-gather after the step
            assert forward == {"all_gather": n_params}, f"rank {rank}: {forward}"
            assert backward == {"all_gather": n_params, "reduce_scatter": n_params}, (
                f"rank {rank}: {backward}")
            assert step == {}, f"rank {rank}: {step}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_zero3_keeps_parameters_whole_only_inside_their_layer(run_on_ranks, world_size):
    result = run_on_ranks(train_on_rank, world_size, 3)[0]
    assert result["after_forward"] == [0] * STEPS, (
        f"full parameter bytes held after the forward: {result['after_forward']} (expected 0: "
        "each layer frees its gathered parameters in its forward hook)")
    assert result["after_backward"] == [0] * STEPS, (
        f"full parameter bytes held after the backward: {result['after_backward']} (expected "
        "0: a layer's parameters are freed once their gradients are reduce-scattered)")
    held, own = zip(*result["while_running"])
    assert held == own, (f"while a layer runs, the model holds {held} bytes of whole "
                         f"parameters; that layer's own are {own}: no other layer's may be whole")


def test_memory_formula_values():
    psi, n = 1_000_000, 4
    assert zero_memory_formula(psi, n, 0) == 16 * psi
    assert zero_memory_formula(psi, n, 1) == 4 * psi + 12 * psi // n
    assert zero_memory_formula(psi, n, 2) == 2 * psi + 14 * psi // n
    assert zero_memory_formula(psi, n, 3) == 16 * psi // n
    assert zero_memory_formula(psi, n, 1, mixed_precision=False) == 8 * psi + 8 * psi // n
    assert zero_memory_formula(psi, n, 2, mixed_precision=False) == 4 * psi + 12 * psi // n
    assert zero_memory_formula(psi, n, 3, mixed_precision=False) == 16 * psi // n


def test_unsharded_adam_holds_16_bytes_per_parameter():
    model = mlp_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    x, upstream = batch(0, 0)
    model(x).backward(upstream)
    optimizer.step()
    num_params = sum(p.numel() for p in model.parameters())
    assert model_state_bytes(model, optimizer)["total"] == zero_memory_formula(
        num_params, 1, 0, mixed_precision=False) == 16 * num_params


# ------------------------------------------------------------------ stage 3 on a transformer Block

BLOCK_CONFIG = ModelConfig(hidden=HIDDEN, heads=2, seq_len=SEQ, ffn_multiple=4)


def block_grads_on_rank() -> dict:
    device = current_device()
    torch.manual_seed(0)
    block = Block(BLOCK_CONFIG).to(device)
    optimizer = ZeroOptimizer(block, stage=3, lr=LR)
    x, upstream = (t.to(device) for t in batch(0, dist.get_rank()))
    block(x).backward(upstream)
    world, rank = dist.get_world_size(), dist.get_rank()
    shards = {name: optimizer.shards[p].grad for name, p in block.named_parameters()}
    full = {}
    for name, shard in shards.items():
        gathered = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(gathered, shard)
        full[name] = torch.cat(gathered)
    return {"grads": full, "held": model_state_bytes(block)["parameters"], "rank": rank}


def test_zero3_block_gradient_shards_match_the_averaged_gradients(run_on_ranks):
    world_size = 4
    results = run_on_ranks(block_grads_on_rank, world_size)
    torch.manual_seed(0)
    block = Block(BLOCK_CONFIG)
    grads = []
    for replica in range(world_size):
        block.zero_grad()
        x, upstream = batch(0, replica)
        block(x).backward(upstream)
        grads.append({n: p.grad.clone() for n, p in block.named_parameters()})
    for rank, result in enumerate(results):
        assert result["held"] == 0, f"rank {rank} holds {result['held']} bytes of whole parameters"
        for name, param in block.named_parameters():
            expected = sum(g[name] for g in grads) / world_size
            assert_close(result["grads"][name][:param.numel()].view_as(param), expected,
                         f"ZeRO-3 averaged gradient of {name}", rank=rank, atol=ATOL, rtol=RTOL,
                         against="the gradient averaged over the replicas",
                         likely_cause="a layer's parameters not gathered again before its "
                                      "backward, or the reduce-scatter not averaged")


# ------------------------------------------------------------------ TP x DP

def tp_mlp_model() -> nn.Module:
    return mlp_model()[:2]  # LayerNorm (replicated over TP) + MLP (TP-sharded)


def tp_dp_on_rank(stage: int) -> dict:
    device = current_device()
    groups = create_process_groups(build_rank_layout(dist.get_world_size(), tp=2, pp=1))
    reference = tp_mlp_model().to(device)
    model = nn.Sequential(reference[0], ParallelMLP(reference[1], groups.tp))
    optimizer = ZeroOptimizer(model, groups.rdp, stage=stage, lr=LR)  # ZeRO over the replicas
    replica = groups.coordinates.rdp_rank
    for step in range(STEPS):
        # the same data on the TP ranks of one replica
        x, upstream = (t.to(device) for t in batch(step, replica))
        model(x).backward(upstream)
        optimizer.step()
        optimizer.zero_grad()
    local = optimizer.full_state_dict()  # this rank's TP shards, whole over RDP
    parameters = dict(model.named_parameters())
    return {name: unshard(value, parameters[name], groups.tp) for name, value in local.items()}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_with_tensor_parallelism_matches_unsharded_adam(run_on_ranks, stage):
    """tp = 2, dp = 2 on 4 ranks: ZeRO over the RDP group shards each rank's TP shard."""
    results = run_on_ranks(tp_dp_on_rank, 4, stage)
    expected = reference_adam(tp_mlp_model(), replicas=2)
    for rank, state in enumerate(results):
        for name, value in expected.items():
            assert_close(state[name], value,
                         f"TP x ZeRO-{stage} parameter {name} after {STEPS} steps",
                         rank=rank, atol=ATOL, rtol=RTOL,
                         against="unsharded torch.optim.Adam on the averaged gradients",
                         likely_cause="ZeRO over the wrong group: it must be the RDP group "
                                      "(replicas of the same TP shard)")
