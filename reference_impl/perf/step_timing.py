"""Time one training step of several modules side by side, on every rank of a launch.

Used wherever the course compares step times (the TP benchmark, the scaling study, lab 3):
the modules take turns in one run, so they see the same machine, and a step takes as long as
its slowest rank.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.comm.device import current_device, wait_for_device

WARMUP_STEPS = 2


def mean_seconds(step: Callable[[], None], device: torch.device, warmups: int,
                 steps: int) -> float:
    """Mean seconds of ``step()`` in this process alone (no process group needed), computing
    on ``device``, after ``warmups`` untimed calls; a GPU's queued work is waited for before
    the clock starts and before it stops."""
    def wait():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmups):
        step()
    wait()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    wait()
    return (time.perf_counter() - began) / steps


def _train_step(module: nn.Module, x: torch.Tensor, upstream: torch.Tensor) -> None:
    """Forward and backward, the input's gradient included (as for a block inside a model)."""
    module.zero_grad(set_to_none=True)
    x.grad = None
    module(x).backward(upstream)


def median_step_seconds(modules: dict[str, nn.Module], x, upstream, repeats: int) -> dict:
    """Median time of one forward + backward per module. The modules take turns (their order
    alternating between repeats) so that both see the same machine; each step starts on every
    rank together (a barrier) and takes as long as its slowest rank (a max over ranks after
    the timing, so no barrier is timed). Collective: call it on every rank."""
    for module in modules.values():
        for _ in range(WARMUP_STEPS):
            _train_step(module, x, upstream)
    names = list(modules)
    times = torch.zeros(len(names), repeats, dtype=torch.float64)
    for repeat in range(repeats):
        for index in (range(len(names)) if repeat % 2 == 0 else reversed(range(len(names)))):
            wait_for_device()
            dist.barrier()
            start = time.perf_counter()
            _train_step(modules[names[index]], x, upstream)
            wait_for_device()
            times[index, repeat] = time.perf_counter() - start
    times = times.to(current_device())
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return {name: statistics.median(times[index].tolist()) for index, name in enumerate(names)}
