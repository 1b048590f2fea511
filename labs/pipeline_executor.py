# Student file for the labs, generated from reference_impl/pipeline/pipeline_executor.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Run a pipeline schedule for real: every rank executes its actions over point-to-point messages.

The third consumer of a schedule (after ``pipeline_validator`` and ``pipeline_simulator``):
naive, GPipe, 1F1B, interleaved 1F1B and ZB-H1 differ only in the action lists it is given. On
each rank, for each action in order: (1) exchange: post the send of the previous action's output
with the receive of this action's input as one ``batch_isend_irecv`` (:func:`post_exchange`,
following ``pipeline_messages.exchange_plan``, checked for deadlock under NCCL's waiting sends
before any message moves) and wait for the receives; (2) compute: :func:`run_action`, which
keeps each (microbatch, stage)'s activations until their last use (B, or W when the backward is
split). Every rank returns a :class:`PipelineRun` (the loss, per-action times, peaks);
:func:`measured_timeline` joins them; :func:`pipeline_train_step` runs the course's GPT.

Lab 4's notebook, "7. Running 1F1B for real"; the exchange, the memory counts and the timing:
``docs/library.md``, "Pipeline parallelism".
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as distributed_c10d
from torch import nn

from reference_impl.memory.activation_memory import SavedActivations
from reference_impl.comm.device import current_device, wait_for_device
from reference_impl.pipeline.gpt_stages import PipelineStepResult, gpt_loss, gpt_pipeline_step
from reference_impl.pipeline.named_schedules import build_schedule
from reference_impl.pipeline.pipeline_messages import (Message, exchange_plan, input_message,
                                                       output_message)
from pipeline_schedules import Action, Schedule
from reference_impl.pipeline.pipeline_simulator import TimedAction, Timeline
from reference_impl.pipeline.pipeline_validator import check_rendezvous, validate
from reference_impl.pipeline.split_backward import DeferredWeightGrads, weight_grads_deferred
from reference_impl.model.precision import autocast


def split_batch(batch: torch.Tensor, m: int) -> list[torch.Tensor]:
    """The batch cut along dimension 0 into ``m`` microbatches of equal size."""
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"the number of microbatches must be an integer >= 1, got {m!r}")
    size = batch.shape[0]
    if size % m:
        raise ValueError(f"batch of {size} samples is not divisible into {m} microbatches")
    return list(batch.split(size // m))


# ---------------------------------------------------------------- point-to-point (lab 4)

def post_exchange(sends: Sequence[tuple[torch.Tensor, int, int]],
                  receives: Sequence[tuple[torch.Tensor, int, int]],
                  group=None) -> tuple[list, list]:
    """Post one exchange's sends and receives *together*; return (send requests, receive requests).

    ``sends`` are (tensor, peer, tag) and ``receives`` (buffer, peer, tag), at least one in
    all; ``peer`` is a rank *in* ``group`` (the pipeline rank; None: the world) and ``tag`` the
    message's tag (``pipeline_messages.Message.tag``). Nothing is waited for here: the caller
    waits for the receives before it computes and for the sends at the end of the step.

    Why one batch (``dist.batch_isend_irecv`` of ``dist.P2POp``): on NCCL a large send
    completes only once its receiver has posted the matching receive. In 1F1B's steady state
    the two ranks of a link send at once (an activation one way, a gradient the other); posted
    one by one, each waits for a receive the other has not posted yet, and both hang
    (``check_rendezvous`` with ``exchange_plan(schedule, paired=False)`` names that cycle).
    Megatron-LM's ``send_forward_recv_backward`` and PyTorch's ``_batch_p2p`` post them together.

    A batch returns one request per operation, in the order posted, where the backend does
    not coalesce (gloo); NCCL returns one request for the whole batch: return it with the
    receives (waiting for it holds the compute stream, not the host).
    """
    raise NotImplementedError('lab4: post_exchange (hint: "the point-to-point layer" in the notebook)')


# ---------------------------------------------------------------- one action (lab 4)

@dataclass
class StepContext:
    """What :func:`run_action` needs besides the action: this rank's share of the batch."""

    microbatches: int  # m: the loss of each microbatch is scaled by 1/m
    last_stage: int  # p*v - 1: its forward ends with the loss
    split_backward: bool  # True: B computes the input gradient only, W the weight gradients
    inputs: Sequence[torch.Tensor] | None  # per microbatch, on the rank of stage 0
    targets: Sequence[torch.Tensor] | None  # per microbatch, on the rank of the last stage
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    losses: dict[int, torch.Tensor] = field(default_factory=dict)  # microbatch -> scaled loss
    # (microbatch, stage) -> its deferred weight gradients, from F to W (split backward only)
    deferred: dict[tuple[int, int], DeferredWeightGrads] = field(default_factory=dict)


def run_action(action: Action, stage: nn.Module, received: torch.Tensor | None,
               saved: dict, context: StepContext) -> torch.Tensor | None:
    """Run one F, B or W of ``stage``; return what the neighbouring stage needs, or None.

    ``received`` is what the action's input message brought: the activation from stage s-1
    for an F, the gradient of this stage's output from stage s+1 for a B; None for W, for the
    first stage's F (its input is ``context.inputs``) and for the last stage's B (it starts
    from the loss). ``saved`` maps (microbatch, stage) to what the backward will need.

    * F: forward; keep (input, output); return the output (detached) for stage s+1. The last
      stage's output is the loss, ``loss_fn(output, target) / m``: nothing to send.
    * B, whole backward: backward from the output with the received gradient, accumulating
      the parameters' ``.grad``; free the entry; return the input's gradient for stage s-1.
    * B, split (ZB-H1): the backward with the linear layers' weight gradients deferred
      (``context.deferred[key]``, filled since the F); keep only those; return the input's
      gradient.
    * W: the deferred weight gradients, added into ``.grad``; free the entry.
    """
    key = (action.microbatch, action.stage)
    is_last = action.stage == context.last_stage
    if action.kind == "F":
        raise NotImplementedError('lab4: run_action, F (hint: "the actions of a step" in the notebook)')

    if action.kind == "B":
        raise NotImplementedError('lab4: run_action, B (hint: "the actions of a step" in the notebook)')

    raise NotImplementedError('lab4: run_action, W (hint: "the actions of a step" in the notebook)')


# ---------------------------------------------------------------- the executor

@dataclass(frozen=True)
class PipelineRun:
    """One rank's view of one run of a schedule."""

    rank: int  # this rank's index in the pipeline (0..p-1)
    loss: torch.Tensor  # 0-d: mean of the microbatch losses, on every rank (from the last stage)
    microbatch_losses: torch.Tensor  # (m,) unscaled, on the last stage's rank; (0,) elsewhere
    events: tuple[TimedAction, ...]  # this rank's actions, seconds since the common barrier
    peak_saved: int  # most (microbatch, stage) entries held at once: activations, in microbatches
    peak_saved_bytes: int  # most bytes autograd saved for them at once (parameters excluded)

    def __getstate__(self) -> dict:
        """A run sent to another process (a rank's result) carries its losses on the CPU."""
        return {**self.__dict__, "loss": self.loss.detach().cpu(),
                "microbatch_losses": self.microbatch_losses.detach().cpu()}


def measured_timeline(schedule: Schedule, runs: Sequence[PipelineRun]) -> Timeline:
    """Every rank's measured events as one ``Timeline`` in seconds."""
    events = sorted((event for run in runs for event in run.events),
                    key=lambda e: (e.rank, e.start))
    return Timeline(schedule, tuple(events), unit="s")


def _microbatches(data, m: int, what: str) -> list[torch.Tensor]:
    if data is None:
        raise ValueError(f"the rank that holds {what} needs them: got None")
    if isinstance(data, torch.Tensor):
        return split_batch(data, m)
    data = list(data)
    if len(data) != m:
        raise ValueError(f"got {len(data)} microbatches of {what} for a schedule with m={m}")
    return data


def run_schedule(schedule: Schedule, stage_modules: dict[int, nn.Module], inputs=None,
                 targets=None, loss_fn: Callable = gpt_loss, *,
                 boundary_shape: Sequence[int] | None = None,
                 boundary_dtype: torch.dtype = torch.float32, group=None,
                 precision: str = "fp32", timed: bool = True) -> PipelineRun:
    """Run this rank's actions of ``schedule``; call it on every rank of the pipeline group.

    ``stage_modules`` maps each of this rank's stages (``schedule.stages_of(rank)``) to its
    module. ``inputs`` (needed on the rank of stage 0) and ``targets`` (on the rank of the
    last stage) are the whole batch, split here with :func:`split_batch`, or lists of m
    microbatches. ``boundary_shape`` and ``boundary_dtype`` describe every tensor passed
    between stages, (micro_batch, seq, hidden) for the GPT, so receive buffers can be made
    before the data arrives. ``group`` is the pipeline's process group (default: the world);
    the pipeline rank is the rank in that group. Gradients are *accumulated* into the stage
    modules' ``.grad``: zero them between steps. ``precision``: ``"bf16"`` runs each F under
    bf16 autocast (the stages exchange the fp32 residual stream: ``boundary_dtype`` stays fp32).
    ``timed=False``: no barrier and no per-action times (``events`` is empty), so nothing in
    the step waits for the device.
    """
    if not dist.is_initialized():
        validate(schedule)  # refuse a broken schedule before asking for a process group
        raise RuntimeError("run_schedule needs an initialised process group (use launch)")
    # Checked under the strictest model: sends that wait for their receiver (NCCL), matched
    # in order per link, posted and waited for exchange by exchange as the plan says.
    plan = exchange_plan(schedule)
    validate(schedule, in_order=True)
    check_rendezvous(schedule, plan)
    p, m = schedule.ranks, schedule.microbatches
    if dist.get_world_size(group) != p:
        raise ValueError(f"the schedule is for {p} ranks but the pipeline group has "
                         f"{dist.get_world_size(group)}")
    rank = dist.get_rank(group)
    mine = schedule.stages_of(rank)
    if set(stage_modules) != set(mine):
        raise ValueError(f"rank {rank} runs stages {list(mine)} of {schedule.name}, but "
                         f"got modules for stages {sorted(stage_modules)}")
    last = schedule.stages - 1
    if schedule.stages > 1 and p > 1 and boundary_shape is None:
        raise ValueError("boundary_shape is needed to receive the tensors between stages, "
                         "e.g. (micro_batch, seq, hidden)")
    device = current_device()
    context = StepContext(
        microbatches=m, last_stage=last, split_backward=schedule.split_backward,
        inputs=_microbatches(inputs, m, "the inputs") if 0 in mine else None,
        targets=_microbatches(targets, m, "the targets") if last in mine else None,
        loss_fn=loss_fn)

    def peer(pipeline_rank: int) -> int:
        return pipeline_rank if group is None else dist.get_global_rank(group, pipeline_rank)

    def now() -> float:
        if not timed:
            return 0.0
        wait_for_device()
        return time.perf_counter()

    saved: dict[tuple[int, int], tuple] = {}
    saved_bytes: dict[tuple[int, int], int] = {}
    handoff: dict[tuple[str, int, int], torch.Tensor] = {}  # between stages on this rank
    arrived: dict[Message, torch.Tensor] = {}  # received, not yet used
    sending: list[tuple] = []  # posted sends and the tensors they read, waited for at the end
    events: list[TimedAction] = []
    peak_saved = peak_bytes = 0
    actions, outgoing = schedule.actions[rank], None
    exchanges = {exchange.step: exchange for exchange in plan[rank]}

    def exchange(step: int) -> None:
        """Post this step's sends and receives together; wait for the receives."""
        planned = exchanges.get(step)
        if planned is None:
            return
        raise NotImplementedError('lab4: PipelineRun.exchange (hint: "the point-to-point layer" in the notebook)')

    if timed:
        dist.barrier(group=group)  # the common origin of every rank's timestamps
    origin = now()
    for step, action in enumerate(actions):
        exchange(step)  # the previous action's output out, this action's input in
        needed = input_message(schedule, action)
        key = (action.microbatch, action.stage)
        if needed is not None:
            received = arrived.pop(needed)
        else:
            received = handoff.pop((action.kind, action.microbatch, action.stage), None)

        start = now()
        stage = stage_modules[action.stage]
        if action.kind == "F":
            counter = SavedActivations(stage.parameters())
            deferring = contextlib.nullcontext()
            if schedule.split_backward:
                context.deferred[key] = DeferredWeightGrads()
                deferring = weight_grads_deferred(stage, context.deferred[key])
            with counter, deferring, autocast(precision, device):
                outgoing = run_action(action, stage, received, saved, context)
            saved_bytes[key] = counter.total
        else:
            outgoing = run_action(action, stage, received, saved, context)
        end = now()
        if timed:
            events.append(TimedAction(rank, action, start - origin, end - origin))

        peak_saved = max(peak_saved, len(saved))
        peak_bytes = max(peak_bytes, sum(saved_bytes.get(key, 0) for key in saved))
        for key in [key for key in saved_bytes if key not in saved]:
            del saved_bytes[key]

        if output_message(schedule, action) is None and outgoing is not None:
            neighbour = action.stage + 1 if action.kind == "F" else action.stage - 1
            handoff[(action.kind, action.microbatch, neighbour)] = outgoing  # same rank
    exchange(len(actions))  # the last action's output
    for work, _ in sending:  # the sends, and the tensors they read, kept until delivered
        work.wait()

    # The loss stays on the device: summed, broadcast, never read here.
    scaled = [context.losses[i].float() for i in sorted(context.losses)]
    loss = torch.stack(scaled).sum() if scaled else torch.zeros((), device=device)
    microbatch_losses = torch.stack(scaled) * m if scaled else torch.zeros(0, device=device)
    dist.broadcast(loss, src=peer(schedule.rank_of(last)), group=group)
    return PipelineRun(rank, loss, microbatch_losses, tuple(events), peak_saved, peak_bytes)


# ---------------------------------------------------------------- the course's GPT

def pipeline_train_step(gpt: nn.Module, schedule: Schedule | str, tokens: torch.Tensor,
                        targets: torch.Tensor, *, microbatches: int | None = None,
                        chunks: int = 1, group=None,
                        precision: str = "fp32") -> PipelineStepResult:
    """One forward and backward of ``gpt`` on (tokens, targets) through a pipeline schedule.

    ``schedule`` is a ``Schedule``, or a name from ``SCHEDULES`` with ``microbatches`` and
    ``chunks`` (v), built for the group's size. Run on every rank of the pipeline group; the
    caller's ``gpt`` is not modified. The loss is the mean of the microbatch losses, which for
    equal microbatches is the full batch's mean cross-entropy, and the gradients are those of
    the single-device GPT (up to fp32 rounding; with ``precision="bf16"``, those of the
    single-device GPT under bf16 autocast, up to bf16 rounding).
    """
    if isinstance(schedule, str):
        schedule = build_schedule(schedule, dist.get_world_size(group), microbatches or 1,
                                  chunks)
    micro_inputs = split_batch(tokens, schedule.microbatches)
    micro_targets = split_batch(targets, schedule.microbatches)
    return gpt_pipeline_step(run_schedule, gpt, schedule, micro_inputs, micro_targets,
                             group=group, precision=precision)
