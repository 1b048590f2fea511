"""Calibrated pipeline stages: stages whose passes take known times, for measuring a schedule
rather than the machine.

:class:`SleepStage` sleeps a fixed time per pass (forward, the backward's input-gradient part B
and weight-gradient part W), so a timeline run with it is made of known costs and the
point-to-point overhead is small beside them; sleeping uses no CPU, so 4 ranks on a 2-core
laptop still measure the schedule. :func:`run_sleeping` runs a schedule with them on every
rank; :func:`fitted_costs` reads the simulator's costs back from a measured timeline.
``benchmarks/pipeline.py`` prints the measured bubble beside the simulator's and the formula;
``tests/library/pipeline/test_pipeline_measured.py`` checks that they agree.
"""
from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.pipeline.pipeline_executor import run_schedule
from reference_impl.pipeline.pipeline_messages import input_message
from reference_impl.pipeline.pipeline_schedules import Action, Schedule

BOUNDARY = (1, 4)  # the tensor the sleeping stages pass on: small, so messages cost little


class _Sleep(torch.autograd.Function):
    """Identity that sleeps ``forward_s`` in the forward and ``backward_s`` in the backward."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class _SleepInW(torch.autograd.Function):
    """Identity whose backward defers a sleep of ``seconds`` to W (``split_backward``)."""

    @staticmethod
    def forward(ctx, x, seconds, store):
        ctx.seconds, ctx.store = seconds, store
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.store.defer(functools.partial(time.sleep, ctx.seconds))
        return grad, None, None


class SleepStage(nn.Module):
    """A stage whose passes take known times: forward ``forward_s``; the backward
    ``input_grad_s`` on the path to the input (B) plus ``weight_grad_s`` on the path to its
    one parameter (W). A whole backward runs both; a split one (ZB-H1) sleeps the second in
    its W pass, as ``split_backward`` defers a linear layer's weight gradient."""

    def __init__(self, forward_s: float, input_grad_s: float, weight_grad_s: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))
        self.forward_s, self.input_grad_s, self.weight_grad_s = \
            forward_s, input_grad_s, weight_grad_s

    def forward(self, x):
        weight = _Sleep.apply(self.weight, 0.0, self.weight_grad_s)
        return _Sleep.apply(x, self.forward_s, self.input_grad_s) * weight

    def forward_deferring_weight_grads(self, x, store):
        weight = _SleepInW.apply(self.weight, self.weight_grad_s, store)
        return _Sleep.apply(x, self.forward_s, self.input_grad_s) * weight


def sleep_stages(schedule: Schedule, rank: int, cost_f: float, cost_b: float,
                 cost_w: float | None = None) -> dict[int, SleepStage]:
    """This rank's stages with the simulator's cost model (``pipeline_simulator.simulate``):
    per chunk, F = cost_f / v and the whole backward cost_b / v, of which W is cost_w / v."""
    if cost_w is None:
        cost_w = cost_b / 2
    v = schedule.chunks
    return {s: SleepStage(cost_f / v, (cost_b - cost_w) / v, cost_w / v)
            for s in schedule.stages_of(rank)}


def run_sleeping(schedule: Schedule, cost_f: float, cost_b: float, cost_w: float | None = None):
    """On every rank: run ``schedule`` with sleeping stages (after a warm-up with no sleep)."""
    rank, device = dist.get_rank(), current_device()
    inputs = torch.ones(schedule.microbatches * BOUNDARY[0], *BOUNDARY[1:], device=device)

    def once(f, b, w):
        stages = {s: stage.to(device) for s, stage in sleep_stages(schedule, rank, f, b, w).items()}
        return run_schedule(schedule, stages, inputs, inputs, lambda y, t: (y * t).sum(),
                            boundary_shape=BOUNDARY)

    once(0.0, 0.0, 0.0)  # warm-up: first messages on each link, allocator, code paths
    return once(cost_f, cost_b, cost_w)


def fitted_costs(timeline) -> dict[str, float]:
    """The simulator's costs as the measured timeline shows them: the median duration of each
    kind of pass (times v: per rank's share), and ``comm``, the median time from the end of a
    pass to the start of the pass on another rank that waited for its message."""
    v = timeline.schedule.chunks
    durations = {kind: statistics.median(e.end - e.start for e in timeline.events
                                         if e.action.kind == kind) * v
                 for kind in {e.action.kind for e in timeline.events}}
    ended = {e.action: e.end for e in timeline.events}
    gaps = []
    for event in timeline.events:
        message = input_message(timeline.schedule, event.action)
        if message is not None:
            kind = "F" if message.kind == "activation" else "B"
            producer = Action(kind, message.microbatch, message.src_stage)
            gaps.append(max(0.0, event.start - ended[producer]))
    costs = {"cost_f": durations["F"], "cost_b": durations["B"] + durations.get("W", 0.0),
             "comm": statistics.median(gaps) if gaps else 0.0}
    if "W" in durations:
        costs["cost_w"] = durations["W"]
    return costs
