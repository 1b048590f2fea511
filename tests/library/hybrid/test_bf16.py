"""Mixed precision (``reference_impl/model/precision.py``): every parallel path in bf16 against the
single-device GPT in bf16.

bf16 autocast computes the matmuls and the attention in bf16 while weights, gradients, their
reduction and Adam's state stay fp32. Each path is run in bf16 and compared with the same
single-device module run in bf16 (never with fp32: bf16 against fp32 differs by as much as two
correct bf16 computations do):

* TP and SP blocks, both attention kernels (2 ranks): output, input gradient, every parameter
  gradient, weights after an SGD step;
* the pipeline executor, 1F1B on 2 ranks: loss and every gradient;
* ZeRO stages 1, 2, 3 (2 ranks): weights after 2 Adam steps on gradients averaged over ranks;
* 3D, dp 2 x tp 2 x pp 2 (8 ranks: DP, TP, vocabulary-parallel head, PP): the loss of 3 steps
  and every weight after them; and the trainer's ``--dtype bf16`` on dp 2 x pp 2.

**Tolerances.** bf16 keeps 8 significant bits: one rounding is off by up to 2^-9 (2e-3)
relative, and the parallel and single-device runs round different partial sums (a row-parallel
layer rounds each rank's partial output, then their sum; the microbatches of a pipeline and the
replicas of DP each round their own smaller matmuls). So every tensor is compared with an
absolute tolerance in units of its own scale, ``atol = TOL * max|reference|``, ``TOL = 2e-2``
for outputs, gradients and losses; the weights after optimizer steps are compared in units of
the largest change the steps made (``STEP_TOL = 3e-2``: the errors of 3 steps add up). A wrong
group, a missing sync or a lost micro-batch is off by tens of percent, far outside.

Observed on CPU (torch 2.13), as a fraction of that scale: TP and SP outputs 9e-4, gradients
and weights after a step 6.3e-3 (both kernels); 1F1B loss 0, gradients 4e-3; ZeRO 1-3 weights
0 (each rank rounds its replica's batch as the reference does, and the fp32 mean of two is
exact); 2x2x2 losses 8e-5, weights after 3 steps 1.1e-2; the trainer's losses 5e-5. In fp32
the same paths agree to 1e-5 (their own tests).
"""
import copy

import pytest
import torch
import torch.distributed as dist

from reference_impl import train
from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.equivalence import one_step_pairs
from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.hybrid.zero import ZeroOptimizer
from reference_impl.model import GPT, MLP, Block, ModelConfig
from reference_impl.pipeline.pipeline_executor import gpt_loss, pipeline_train_step
from reference_impl.model.precision import autocast, check_precision, weight_copy_bytes
from reference_impl.tp.sequence_parallel import SequenceParallelBlock, sync_sequence_parallel_grads
from reference_impl.tp.tp_attention import ParallelBlock
from reference_impl.tp.tp_collectives import all_gather_along
from reference_impl.tp.tp_layers import full_state
from reference_impl.toys import random

TOL = 2e-2  # of each tensor's largest |element|: outputs, gradients, losses
STEP_TOL = 3e-2  # of the largest change the steps made: weights after optimizer steps
CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=32, heads=4, layers=2)
SHAPE = (2, CONFIG.seq_len, CONFIG.hidden)


def assert_close_bf16(actual, expected, what, rank=None, scale=None, tol=TOL):
    """|actual - expected| <= tol * scale, scale = max|expected| unless given."""
    expected = torch.as_tensor(expected).double()
    scale = expected.abs().max().item() if scale is None else scale
    assert scale > 0, f"{what}: the reference is all zeros: a weak check"
    assert_close(actual, expected, f"{what} (bf16)", rank=rank, atol=tol * scale, rtol=0,
                 against="the single-device model in bf16")


# ---------------------------------------------------------------- what bf16 means

def test_bf16_computes_in_bf16_and_keeps_weights_gradients_and_adam_in_fp32():
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    tokens = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    seen = []
    gpt.blocks[0].mlp.fc1.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    losses = {}
    for precision in ("fp32", "bf16"):
        model = copy.deepcopy(gpt)
        optimizer = torch.optim.Adam(model.parameters(), foreach=True)
        with autocast(precision, "cpu"):
            loss = gpt_loss(model(tokens), tokens)
        loss.backward()
        optimizer.step()
        losses[precision] = loss.item()
        assert loss.dtype == torch.float32, f"{precision}: the loss is {loss.dtype}"
        for name, parameter in model.named_parameters():
            assert parameter.dtype == parameter.grad.dtype == torch.float32, (
                f"{precision}: {name} is {parameter.dtype}, its gradient {parameter.grad.dtype}")
            state = optimizer.state[parameter]
            assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32, name
    assert seen == [torch.float32, torch.bfloat16], f"fc1's output dtypes: {seen}"
    assert losses["fp32"] != losses["bf16"], "bf16 gave fp32's loss to the last bit: not bf16"
    matmul_weights = sum(m.weight.numel() for m in gpt.modules() if isinstance(m, torch.nn.Linear))
    assert weight_copy_bytes(gpt, "bf16") == 2 * matmul_weights
    assert weight_copy_bytes(gpt, "fp32") == 0
    with pytest.raises(ValueError, match="precision must be one of 'fp32', 'bf16', got 'fp16'"):
        check_precision("fp16")


# ---------------------------------------------------------------- TP and SP

def tp_and_sp_pairs():
    """Per attention kernel: the TP block's and the SP block's (what, parallel, reference)."""
    results = {}
    for attention in ("explicit", "sdpa"):
        torch.manual_seed(0)
        block = Block(ModelConfig(**{**CONFIG.__dict__, "attention": attention})).to(
            current_device())
        x = random(SHAPE, seed=1)
        results[f"TP {attention}"] = one_step_pairs(block, ParallelBlock(block), x,
                                                    precision="bf16")
        reference, sp = copy.deepcopy(block), SequenceParallelBlock(block)
        upstream = random(SHAPE, seed=2)
        x_full = x.clone().requires_grad_()
        shard = x.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].clone().requires_grad_()
        with autocast("bf16"):
            y, y_shard = reference(x_full), sp(shard)
        y.backward(upstream)
        y_shard.backward(upstream.chunk(dist.get_world_size(), dim=1)[dist.get_rank()])
        sync_sequence_parallel_grads(sp)
        pairs = [("output", all_gather_along(y_shard.detach(), 1, None), y),
                 ("input grad", all_gather_along(shard.grad, 1, None), x_full.grad)]
        parameters = dict(reference.named_parameters())
        pairs += [(f"grad of {name}", grad, parameters[name].grad)
                  for name, grad in full_state(sp, grads=True).items()]
        for module in (reference, sp):
            torch.optim.SGD(module.parameters(), lr=0.1).step()
        pairs += [(f"{name} after a step", value, parameters[name])
                  for name, value in full_state(sp).items()]
        results[f"SP {attention}"] = [(w, a.detach().cpu(), b.detach().cpu()) for w, a, b in pairs]
    return results, {name: p.detach().cpu() for name, p in block.named_parameters()}


def test_tp_and_sp_blocks_in_bf16_match_the_single_device_block(run_on_ranks):
    for rank, (results, initial) in enumerate(run_on_ranks(tp_and_sp_pairs, 2)):
        for path, pairs in results.items():
            for what, parallel, reference in pairs:
                if what.endswith("after a step"):
                    before = initial[what.removesuffix(" after a step")]
                    change = (reference - before).abs().max().item()
                    assert_close_bf16(parallel, reference, f"{path}: {what}", rank,
                                      scale=change, tol=STEP_TOL)
                else:
                    assert_close_bf16(parallel, reference, f"{path}: {what}", rank)


# ---------------------------------------------------------------- PP

def pipelined(gpt, tokens, schedule):
    step = pipeline_train_step(gpt.to(current_device()), schedule, tokens.to(current_device()),
                               tokens.to(current_device()), microbatches=2, precision="bf16")
    return step.loss, step.grads


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])  # zb-h1: the split backward in bf16
def test_pipeline_in_bf16_matches_the_single_device_gpt(run_on_ranks, schedule):
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    tokens = torch.randint(CONFIG.vocab_size, (4, CONFIG.seq_len),
                           generator=torch.Generator().manual_seed(1))
    reference = copy.deepcopy(gpt)
    with autocast("bf16", "cpu"):
        loss = gpt_loss(reference(tokens), tokens)
    loss.backward()
    expected = dict(reference.named_parameters())
    seen = set()
    results = run_on_ranks(pipelined, 2, gpt, tokens, schedule)
    for rank, (pipelined_loss, grads) in enumerate(results):
        assert_close_bf16(pipelined_loss, loss.item(), f"{schedule} loss", rank)
        for name, grad in grads.items():
            assert_close_bf16(grad, expected[name].grad, f"{schedule} gradient of {name}", rank)
        seen |= set(grads)
    assert seen == set(expected), f"no gradient for {set(expected) - seen}"


# ---------------------------------------------------------------- ZeRO

ZERO_LR, ZERO_EPS, ZERO_STEPS = 1e-2, 1e-1, 2  # eps 0.1: the step is smooth in the gradient


def zero_batch(step, replica):
    generator = torch.Generator().manual_seed(100 * step + replica)
    return torch.randn(*SHAPE, generator=generator), torch.randn(*SHAPE, generator=generator)


def zero_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(CONFIG.hidden),
                               MLP(CONFIG.hidden, 4 * CONFIG.hidden))


def zero_on_rank():
    states = {}
    for stage in (1, 2, 3):
        model = zero_model().to(current_device())
        optimizer = ZeroOptimizer(model, stage=stage, lr=ZERO_LR, eps=ZERO_EPS)
        for step in range(ZERO_STEPS):
            x, upstream = (t.to(current_device()) for t in zero_batch(step, dist.get_rank()))
            with autocast("bf16"):
                y = model(x)
            y.backward(upstream.to(y.dtype))
            optimizer.step()
            optimizer.zero_grad()
        states[stage] = {name: value.cpu() for name, value in optimizer.full_state_dict().items()}
        optimizer.remove_hooks()
    return states


def test_zero_stages_in_bf16_match_unsharded_adam_in_bf16(run_on_ranks):
    model = zero_model()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    adam = torch.optim.Adam(model.parameters(), lr=ZERO_LR, eps=ZERO_EPS)
    for step in range(ZERO_STEPS):
        grads = []
        for replica in range(2):
            model.zero_grad()
            x, upstream = zero_batch(step, replica)
            with autocast("bf16", "cpu"):
                y = model(x)
            y.backward(upstream.to(y.dtype))
            grads.append([p.grad.clone() for p in model.parameters()])
        for index, parameter in enumerate(model.parameters()):
            parameter.grad = (grads[0][index] + grads[1][index]) / 2
        adam.step()
    for rank, states in enumerate(run_on_ranks(zero_on_rank, 2)):
        for stage, state in states.items():
            for name, expected in model.named_parameters():
                change = (expected.detach() - initial[name]).abs().max().item()
                assert_close_bf16(state[name], expected, f"ZeRO-{stage} {name} after "
                                  f"{ZERO_STEPS} Adam steps", rank, scale=change, tol=STEP_TOL)


# ---------------------------------------------------------------- 3D and the trainer

STEPS, BATCH = 3, 8


def train_3d_bf16(gpt, dataset):
    context = hybrid.initialize_parallelism(dp=2, tp=2, pp=2)
    model = hybrid.build_3d_gpt(gpt, context, microbatches=2, precision="bf16")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = [hybrid.train_step(model, tokens, targets, optimizer).item()
              for tokens, targets in dataset]
    return losses, hybrid.gather_full_state(model)


def test_3d_in_bf16_matches_single_device_training_in_bf16(run_on_ranks):
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    dataset = hybrid.make_dataset(0, STEPS, BATCH, CONFIG.seq_len, CONFIG.vocab_size)
    losses, state = hybrid.train_single_device(
        gpt, dataset, lambda p: torch.optim.SGD(p, lr=0.5), precision="bf16")
    initial = dict(gpt.named_parameters())
    for rank, (rank_losses, rank_state) in enumerate(run_on_ranks(train_3d_bf16, 8, gpt,
                                                                  dataset)):
        assert_close_bf16(torch.tensor(rank_losses), torch.tensor(losses),
                          f"2x2x2 losses of steps 1..{STEPS}", rank)
        for name, expected in state.items():
            change = (expected - initial[name].detach()).abs().max().item()
            assert_close_bf16(rank_state[name], expected, f"2x2x2 {name} after {STEPS} steps",
                              rank, scale=change, tol=STEP_TOL)


def test_trainer_dtype_bf16_matches_single_device_training_in_bf16():
    argv = ["--dp", "2", "--pp", "2", "--steps", "3", "--layers", "2", "--hidden", "16",
            "--heads", "2", "--seq", "8", "--vocab", "32", "--batch", "8", "--optimizer", "sgd"]
    result = train.main([*argv, "--dtype", "bf16"])
    bf16, _ = train.train_one_device(train.parse_args([*argv, "--dtype", "bf16"]))
    fp32, _ = train.train_one_device(train.parse_args(argv))
    assert_close_bf16(torch.tensor(result["losses"]), torch.tensor(bf16),
                      "the trainer's --dtype bf16 losses (2x1x2)")
    assert result["losses"] != fp32, "--dtype bf16 trained in fp32"
