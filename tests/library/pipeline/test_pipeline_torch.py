"""Cross-check with PyTorch's own pipelining: same GPT, weights, batch and stages, so the same
loss and gradients as the reference executor.

``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe`` / ``Schedule1F1B`` /
``ScheduleInterleaved1F1B``) runs on gloo and the CPU. Both are given the stage modules
``build_gpt_stages`` cuts from one GPT (PyTorch places virtual stage s on rank s % p, as the
reference does); PyTorch's schedules scale the gradients by 1/m (``scale_grads=True``) and
return each microbatch's unscaled loss, whose mean is the reference's loss.

Tolerance (fp32): both sum the same m microbatch gradients, possibly in another order:
atol 1e-5, rtol 1e-5 (observed: within 3e-8).
"""
import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.model import GPT, ModelConfig
from reference_impl.pipeline.gpt_stages import build_gpt_stages, gpt_loss
from reference_impl.pipeline.pipeline_executor import pipeline_train_step
from reference_impl.pipeline.named_schedules import build_schedule

pipelining = pytest.importorskip("torch.distributed.pipelining")

ATOL = RTOL = 1e-5
CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=6)
TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                   "interleaved": "ScheduleInterleaved1F1B"}


def both_executors(gpt, name, m, v, tokens, targets):
    """On each rank: (loss, grads) from the reference executor and from PyTorch's."""
    rank, p, device = dist.get_rank(), dist.get_world_size(), current_device()
    tokens, targets = tokens.to(device), targets.to(device)
    ours = pipeline_train_step(gpt, name, tokens, targets, microbatches=m, chunks=v)

    schedule = build_schedule(name, p, m, v)
    stages, names = build_gpt_stages(gpt, schedule, rank)
    torch_stages = [pipelining.PipelineStage(module, s, schedule.stages, device)
                    for s, module in sorted(stages.items())]
    runner_class = getattr(pipelining, TORCH_SCHEDULES[name])
    runner = runner_class(torch_stages if v > 1 else torch_stages[0], n_microbatches=m,
                          loss_fn=gpt_loss)
    losses = []
    if rank == 0:
        runner.step(tokens)
    elif rank == p - 1:
        runner.step(target=targets, losses=losses)
    else:
        runner.step()
    theirs_loss = torch.stack(losses).mean().item() if losses else None
    theirs_grads = {names[id(parameter)]: parameter.grad.clone()
                    for module in stages.values() for parameter in module.parameters()
                    if parameter.grad is not None}
    return ours.loss, ours.grads, theirs_loss, theirs_grads


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 2, 4, 1), ("1f1b", 4, 8, 1),
                                           ("interleaved", 2, 4, 2)])
def test_reference_executor_matches_torch_pipelining(run_on_ranks, name, p, m, v):
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, CONFIG.vocab_size, (2 * m, CONFIG.seq_len), generator=generator)
    targets = torch.randint(0, CONFIG.vocab_size, (2 * m, CONFIG.seq_len), generator=generator)
    per_rank = run_on_ranks(both_executors, p, gpt, name, m, v, tokens, targets)
    what = f"{name} p={p} m={m}" + (f" v={v}" if v > 1 else "")
    against = f"torch.distributed.pipelining's {TORCH_SCHEDULES[name]}"
    last_loss = per_rank[-1][2]
    for rank, (loss, grads, _, torch_grads) in enumerate(per_rank):
        assert_close(loss, last_loss, f"{what}: loss", rank=rank, atol=ATOL, rtol=RTOL,
                     against=against)
        assert set(grads) == set(torch_grads), f"{what}: rank {rank} holds other parameters"
        for parameter, grad in grads.items():
            assert_close(grad, torch_grads[parameter], f"{what}: gradient of {parameter}",
                         rank=rank, atol=ATOL, rtol=RTOL, against=against)
