"""The course's GPT as pipeline stages: its layers cut into stages, its loss, its pipelined step.

:class:`Stage` (a contiguous run of layers), :func:`gpt_loss` (the executor's default loss),
:func:`build_gpt_stages` (``gpt_layers(gpt)`` cut into p*v stages by parameter count, built
from deep copies of the single-device layers with their names) and :func:`gpt_pipeline_step`
(those stages through a schedule by a given executor, returning the loss and the gradients by
name). The executor's ``pipeline_train_step`` calls it with its own ``run_schedule``, lab 4's
graded checks with the student's: the executor imports this module, never the other way round.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.pipeline.pipeline_partition import gpt_layers, layer_sizes, partition
from reference_impl.pipeline.pipeline_schedules import Schedule

Run = TypeVar("Run")  # what the executor's run_schedule returns: its PipelineRun


class Stage(nn.Sequential):
    """One virtual stage: a contiguous run of the model's layers, applied in order."""


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token: the single-device GPT's training loss."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_gpt_stages(gpt: nn.Module, schedule: Schedule,
                     rank: int) -> tuple[dict[int, Stage], dict[int, str]]:
    """This rank's stages of ``gpt`` (deep copies of its layers) and {id(parameter): name}.

    ``gpt_layers`` (embedding, blocks, head) is cut into ``schedule.stages`` stages by
    parameter count; the names are the single-device GPT's (``blocks.0.attn.qkv.weight``).
    """
    replica = copy.deepcopy(gpt)
    names = {id(parameter): name for name, parameter in replica.named_parameters()}
    layers = gpt_layers(replica)
    ranges = partition(layer_sizes(layers), schedule.stages)
    stages = {s: Stage(*layers[ranges[s].start:ranges[s].stop]).to(current_device())
              for s in schedule.stages_of(rank)}
    return stages, names


@dataclass(frozen=True)
class PipelineStepResult(Generic[Run]):
    loss: float  # the full-batch mean loss, on every rank
    grads: dict[str, torch.Tensor]  # this rank's parameters' gradients, by GPT parameter name
    run: Run  # what the executor returned on this rank


def gpt_pipeline_step(run_schedule: Callable[..., Run], gpt: nn.Module,
                      schedule: Schedule, micro_inputs: Sequence[torch.Tensor],
                      micro_targets: Sequence[torch.Tensor], *, group=None,
                      precision: str = "fp32") -> PipelineStepResult[Run]:
    """One forward and backward of ``gpt`` on its microbatches, through ``run_schedule``.

    Run on every rank of the pipeline group; the caller's ``gpt`` is not modified. This rank's
    stages are built with :func:`build_gpt_stages`, the microbatches moved to this rank's
    device, and every tensor between stages is (micro_batch, seq, hidden).
    """
    rank = dist.get_rank(group)
    stages, names = build_gpt_stages(gpt, schedule, rank)
    device = current_device()
    shape = (micro_inputs[0].shape[0], micro_inputs[0].shape[1], gpt.config.hidden)
    run = run_schedule(schedule, stages, [t.to(device) for t in micro_inputs],
                       [t.to(device) for t in micro_targets], gpt_loss,
                       boundary_shape=shape, group=group, precision=precision)
    grads = {names[id(parameter)]: parameter.grad.detach().cpu().clone()
             for stage in stages.values() for parameter in stage.parameters()
             if parameter.grad is not None}
    return PipelineStepResult(float(run.loss), grads, run)
