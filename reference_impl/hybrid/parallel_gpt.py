"""The course's GPT under a layout (lab 5's API): dp x tp x pp, and whatever else the plan
composes (``parallelize.py``), in the spirit of ApX Machine Learning's masterclass on hybrid
parallelism:

    context = initialize_parallelism(dp=2, tp=2, pp=2)          # on every one of 8 ranks
    model = build_3d_gpt(gpt, context, microbatches=2, schedule="1f1b")  # precision="bf16"
    loss = train_step(model, tokens, targets, optimizer)          # the global batch, every rank
    state = gather_full_state(model)                              # the single-device state_dict

Every step's loss and the weights after it match single-device training of the same GPT on the
same global batch (``tests/library/hybrid/test_hybrid.py``). What each piece does (the Megatron
data layout, the schedule, the gradient reduction, clipping): docs/library.md, "Hybrid and 3D
parallelism".
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device
from reference_impl.comm.parallel_dims import ParallelContext, ParallelDims
from reference_impl.hybrid.context_parallel import context_shard
from reference_impl.hybrid.data_parallel import DEFAULT_BUCKET_BYTES, SyncReport
from reference_impl.hybrid.grad_norm import clip_grad_norm_
from reference_impl.hybrid.lr_schedule import set_lr
from reference_impl.hybrid.parallelize import (  # noqa: F401 (TPEmbedding, TPHead: exported)
    ParallelGPT, TPEmbedding, TPHead, finish_gradients, parallelize_gpt,
    tensor_parallel_layer)
from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.model import GPT
from reference_impl.pipeline.gpt_stages import gpt_loss
from reference_impl.pipeline.pipeline_executor import run_schedule, split_batch
from reference_impl.pipeline.pipeline_schedules import Schedule
from reference_impl.model.precision import autocast
from reference_impl.tp.tp_layers import unshard


# ---------------------------------------------------------------- the context

def initialize_parallelism(dp: int, tp: int = 1, pp: int = 1, order: str = "megatron",
                           cp: int = 1) -> ParallelContext:
    """Lay out ``dp * tp * cp * pp`` ranks and create their process groups (call on every
    rank): ``comm.parallel_dims.ParallelDims(...).build()``."""
    return ParallelDims(dp, tp, pp, cp, order=order).build()


# ---------------------------------------------------------------- the model

def build_3d_gpt(gpt: GPT, context: ParallelContext, microbatches: int,
                 schedule: str | Schedule = "1f1b", chunks: int = 1, vocab_parallel: bool = True,
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
                 precision: str = "fp32") -> ParallelGPT:
    """This rank's part of ``gpt`` under ``context``: ``parallelize.parallelize_gpt`` with
    dp x tp x pp only (no sp, no recomputation, dp_kind sync)."""
    plan = TrainingPlan(context.dp, context.tp, context.pp, schedule=schedule,
                        microbatches=microbatches, chunks=chunks, vocab_parallel=vocab_parallel,
                        precision=precision, bucket_bytes=bucket_bytes)
    return parallelize_gpt(gpt, plan, context)


# ---------------------------------------------------------------- training

def replica_slice(batch: torch.Tensor, context: ParallelContext) -> torch.Tensor:
    """This rank's share of the global batch (Megatron layout: the data is split over the RDP
    group; every rank of a TP group and of a pipeline gets the same slice; with context
    parallelism, the CP rank's load-balanced part of each sample's tokens)."""
    samples = split_batch(batch, context.dp)[context.replica]
    return context_shard(samples, context.cp, context.coordinates.cp_rank)


@dataclass(frozen=True)
class StepResult:
    loss: torch.Tensor  # 0-d, on the device: the global batch's mean loss, on every rank
    sync: SyncReport | None  # dp_kind sync's report (None for the other kinds)
    grad_norm: torch.Tensor | None = None  # 0-d, the global gradient norm (with max_norm)


def train_step(model: ParallelGPT, tokens: torch.Tensor, targets: torch.Tensor,
               optimizer: torch.optim.Optimizer, *, convention: str = "megatron",
               return_report: bool = False,
               max_norm: float | None = None) -> torch.Tensor | StepResult:
    """One optimizer step on the global batch (tokens, targets), given on every rank; the
    global batch's mean loss, a 0-d tensor on this rank's device (``.item()`` reads it, and
    waits for the device: do it only where the value is needed).

    ``convention`` is passed to ``sync_gradients`` (dp_kind sync only); this trainer's data
    layout is Megatron's, so ``"megatron"`` is the right one (``"sagemaker"`` is accepted to
    show what goes wrong). ``max_norm``: clip the gradients by their global norm before the
    step (``grad_norm.clip_grad_norm_``; 0 measures the norm only, None skips it); the norm is
    the report's ``grad_norm``.
    """
    context = model.context
    return train_step_on_share(model, replica_slice(tokens, context),
                               replica_slice(targets, context), optimizer, convention=convention,
                               return_report=return_report, max_norm=max_norm)


def train_step_on_share(model: ParallelGPT, tokens: torch.Tensor, targets: torch.Tensor,
                        optimizer: torch.optim.Optimizer, *, convention: str = "megatron",
                        return_report: bool = False,
                        max_norm: float | None = None) -> torch.Tensor | StepResult:
    """:func:`train_step` on this rank's share of the global batch (:func:`replica_slice`'s,
    as a sharded data loader reads it: ``data/sharded_batches.py``)."""
    context, device = model.context, current_device()
    optimizer.zero_grad(set_to_none=True)
    # non_blocking: a copy from the host does not wait for the device's queued work
    local_tokens = tokens.to(device, non_blocking=True)
    local_targets = targets.to(device, non_blocking=True)
    m = model.schedule.microbatches
    micro_batch = local_tokens.shape[0] // m if local_tokens.shape[0] % m == 0 else None
    if micro_batch is None:
        raise ValueError(f"the replica's batch of {local_tokens.shape[0]} samples is not "
                         f"divisible into {m} microbatches")
    run = run_schedule(model.schedule, model.stage_modules(), local_tokens, local_targets,
                       model.loss_fn,
                       boundary_shape=model.boundary_shape(micro_batch, local_tokens.shape[1]),
                       group=context.groups.pp, precision=model.precision, timed=False)
    report = finish_gradients(model, convention)  # dp_kind's reduction, sp's sum over TP
    norm = None if max_norm is None else clip_grad_norm_(model, max_norm)
    optimizer.step()
    result = StepResult(mean_over_shards(run.loss, context), report, norm)
    return result if return_report else result.loss


def mean_over_shards(loss: torch.Tensor, context: ParallelContext) -> torch.Tensor:
    """The global batch's mean loss from each rank's mean over its tokens: the mean over the
    dp x cp shards (all of equal size), on every rank. In place."""
    shards = context.dp * context.cp
    if shards > 1:
        dist.all_reduce(loss, group=context.groups.rdp_cp_or_rdp)
        loss /= shards
    return loss


def gather_full_state(model: ParallelGPT) -> dict[str, torch.Tensor]:
    """The single-device GPT's parameters by name (CPU tensors), on every rank. Collective over
    the TP and PP groups (every rank must call it)."""
    groups, values = model.context.groups, model.local_values()
    local = {}
    for name, parameter in model.named_gpt_parameters():  # same order on every TP peer
        full = unshard(values[id(parameter)], parameter, groups.tp).cpu()
        if name in ("token_embedding.weight", "lm_head.weight"):
            full = full[:model.config.vocab_size]  # drop the vocabulary's padding rows
        local[name] = full.clone()
    pieces = [(model.context.pp, groups.pp)]
    if model.context.experts is not None:  # each EP rank holds other experts
        pieces.insert(0, (model.context.experts.ep_size, model.context.experts.ep))
    for size, group in pieces:
        if size > 1:
            parts: list = [None] * size
            dist.all_gather_object(parts, local, group=group)
            local = {name: tensor for part in parts for name, tensor in part.items()}
    return local


# ---------------------------------------------------------------- data and the oracle

def make_dataset(seed: int, steps: int, batch: int, seq_len: int,
                 vocab_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` global batches of (tokens, targets): noisy counting sequences (each token the
    previous plus a small random step, mod vocab), targets the next tokens. Deterministic."""
    generator = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(steps):
        start = torch.randint(vocab_size, (batch, 1), generator=generator)
        steps_ = torch.randint(1, 3, (batch, seq_len), generator=generator)
        sequence = torch.cat([start, start + steps_.cumsum(dim=1)], dim=1) % vocab_size
        data.append((sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()))
    return data


class BatchList:
    """Global batches held in memory (:func:`make_dataset`'s), read as a sharded loader is:
    ``global_batch(step)``, and ``rank_batch(step, context)``, this rank's share."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]):
        self.batches = batches

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[step]

    def rank_batch(self, step: int, context: ParallelContext) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, targets = self.batches[step]
        return replica_slice(tokens, context), replica_slice(targets, context)


def train_single_device(gpt: GPT, dataset, make_optimizer, precision: str = "fp32", *,
                        max_norm: float | None = None,
                        lr_at: Callable[[int], float] | None = None) -> tuple[list[float], dict]:
    """The oracle: train a deep copy of ``gpt`` on the same global batches, the forward under
    ``precision``; the losses of every step and the final parameters by name. ``max_norm`` > 0
    clips the gradients by their norm (``torch.nn.utils.clip_grad_norm_``); ``lr_at(n)`` is the
    learning rate of step n = 1, 2, ... (default: the optimizer's own)."""
    model = copy.deepcopy(gpt)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for number, (tokens, targets) in enumerate(dataset, start=1):
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, next(model.parameters()).device):
            loss = gpt_loss(model(tokens), targets)
        loss.backward()
        if max_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
        if lr_at is not None:
            set_lr(optimizer, lr_at(number))
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}
