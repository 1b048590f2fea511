"""Activation recomputation inside pipeline stages: the executor's loss and gradients are the
same with full or selective recomputation as without, and the activations the stages hold at
their peak shrink as ``activation_memory.model_activation_bytes`` says they should.

Tolerance (fp32): loss and gradients to atol = rtol = 1e-5 (recomputation reruns the same
operations: observed, bit-identical). Memory: the peak bytes saved per rank, with 1F1B on 2
ranks (each stage holds its blocks' activations for up to min(p - r, m) microbatches), are
ordered full < selective < none on every rank, and the saving of each mode equals the
per-block formula's times the blocks on the rank times the microbatches in flight.
"""
import pytest
import torch
import torch.distributed as dist

from reference_impl.memory.activation_memory import model_activation_bytes
from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.model import GPT, Block, ModelConfig
from reference_impl.pipeline.gpt_stages import build_gpt_stages, gpt_loss
from reference_impl.pipeline.pipeline_executor import run_schedule, split_batch
from reference_impl.pipeline.pipeline_schedules import one_f_one_b
from reference_impl.memory.recompute import recompute

CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=4)
P, M, MICRO_BATCH = 2, 4, 2
TOLERANCE = dict(atol=1e-5, rtol=1e-5)


def run_with(mode):
    """On each rank: 1F1B over the GPT's stages with ``mode`` recomputation in every block."""
    device = current_device()
    torch.manual_seed(0)
    gpt = GPT(CONFIG).to(device)
    schedule = one_f_one_b(P, M)
    rank = dist.get_rank()
    stages, names = build_gpt_stages(gpt, schedule, rank)
    for stage in stages.values():
        if any(isinstance(module, Block) for module in stage.modules()):
            recompute(stage, mode)
    generator = torch.Generator().manual_seed(1)
    tokens, targets = (torch.randint(0, CONFIG.vocab_size, (MICRO_BATCH * M, CONFIG.seq_len),
                                     generator=generator).to(device) for _ in range(2))
    run = run_schedule(schedule, stages, split_batch(tokens, M), split_batch(targets, M),
                       gpt_loss, boundary_shape=(MICRO_BATCH, CONFIG.seq_len, CONFIG.hidden))
    grads = {names[id(p)]: p.grad.clone() for s in stages.values() for p in s.parameters()}
    blocks = sum(isinstance(module, Block) for s in stages.values() for module in s.modules())
    return run.loss, grads, run.peak_saved_bytes, run.peak_saved, blocks


@pytest.fixture(scope="module")
def runs():
    return {mode: launch(run_with, P, mode, backend="gloo") for mode in (None, "selective", "full")}


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputed_stages_train_exactly_like_stored_ones(runs, mode):
    for rank, ((loss, grads, *_), (expected_loss, expected_grads, *_)) in enumerate(
            zip(runs[mode], runs[None])):
        assert_close(loss, expected_loss, f"loss with {mode} recomputation", rank=rank,
                     against="the run without recomputation", **TOLERANCE)
        for name, gradient in grads.items():
            assert_close(gradient, expected_grads[name], f"gradient of {name} ({mode})",
                         rank=rank, against="the run without recomputation", **TOLERANCE)


def test_recomputation_shrinks_the_activations_a_stage_holds_by_the_formula(runs):
    s, b, h, a = CONFIG.seq_len, MICRO_BATCH, CONFIG.hidden, CONFIG.heads
    per_block = {mode: model_activation_bytes(s, b, h, a, recompute=mode)
                 for mode in (None, "selective", "full")}
    for rank in range(P):
        peak = {mode: runs[mode][rank][2] for mode in runs}
        in_flight, blocks = runs[None][rank][3], runs[None][rank][4]
        assert peak["full"] < peak["selective"] < peak[None], f"rank {rank}: {peak}"
        for mode in ("selective", "full"):
            saved = peak[None] - peak[mode]
            expected = (per_block[None] - per_block[mode]) * blocks * in_flight
            assert saved == expected, (
                f"rank {rank}: {mode} recomputation saved {saved} bytes at the peak; the formula "
                f"gives ({per_block[None]} - {per_block[mode]}) bytes x {blocks} blocks x "
                f"{in_flight} microbatches in flight = {expected}")
