"""Lab 4, graded: the executor's step (``run_action``: one forward or backward of one stage).

With the student's ``run_action``, one pipelined training step of a small GPT, GPipe and 1F1B
on 2 and 4 CPU ranks, must give the single-device loss and every parameter's gradient.
Tolerance (fp32): atol = rtol = 1e-5 (pipelining only changes how the batch's gradient is
summed; observed: within 3e-7).
"""
import copy

import pytest
import torch
import torch.nn.functional as F

from reference_impl.checks import assert_close
from reference_impl.comm.launcher import current_device
from reference_impl.model import GPT, ModelConfig

pytestmark = pytest.mark.lab4

CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=2)
MICRO_BATCH, TOLERANCE = 2, dict(atol=1e-5, rtol=1e-5)


def pipelined_and_single_device(impl, name, m):
    device = current_device()
    torch.manual_seed(0)
    gpt = GPT(CONFIG).to(device)
    generator = torch.Generator().manual_seed(m)
    tokens, targets = (torch.randint(0, CONFIG.vocab_size, (MICRO_BATCH * m, CONFIG.seq_len),
                                     generator=generator).to(device) for _ in range(2))
    reference = copy.deepcopy(gpt)  # the single-device step, before the submission is loaded
    logits = reference(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    expected = {name: p.grad.cpu() for name, p in reference.named_parameters()}
    step = impl.module("pipeline_executor").pipeline_train_step(gpt, name, tokens, targets,
                                                                 microbatches=m)
    return (float(step.loss), loss.item(),
            [(n, g.detach().cpu(), expected[n]) for n, g in step.grads.items()])


@pytest.mark.parametrize("p, m", [(2, 3), (4, 8)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_pipelined_step_trains_like_one_device(impl, run_on_ranks, name, p, m):
    for rank, (loss, expected_loss, grads) in enumerate(
            run_on_ranks(pipelined_and_single_device, p, impl, name, m)):
        assert_close(loss, expected_loss, f"{name} loss (p={p}, m={m})", rank=rank,
                     likely_cause="the forward action: is the last stage's loss divided by the "
                                  "number of microbatches, and the right input fed to stage 0?",
                     **TOLERANCE)
        assert grads, f"rank {rank} holds no gradient: did the backward action run?"
        for parameter, gradient, expected in grads:
            assert_close(gradient, expected, f"{name} gradient of {parameter} (p={p}, m={m})",
                         rank=rank, likely_cause="the backward action: backward from the saved "
                         "output with the received gradient, and return the input's gradient "
                         "to the previous stage", **TOLERANCE)
