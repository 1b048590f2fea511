"""Compose the kit's parallelisms on the course's GPT, one small step each (the API shape of
torchtitan's ``parallelize_llama``: apply_pp, apply_tp, apply_ac, apply_fsdp / apply_ddp).

    plan = TrainingPlan(dp=2, tp=2, sp=True, dp_kind="zero1", recompute="selective")
    plan.check(gpt.config)                                  # once, where the run starts
    context = plan.dims.build()                             # on every rank: groups, mesh
    model = parallelize_gpt(gpt, plan, context)             # this rank's part of gpt
    optimizer = build_optimizer(model, torch.optim.AdamW(model.parameters(), lr=3e-4))
    loss = parallel_gpt.train_step(model, tokens, targets, optimizer, max_norm=1.0)

The steps, in order: :func:`apply_pp` keeps this rank's stages of ``gpt_layers(gpt)``;
:func:`apply_tp` makes each kept layer tensor-parallel, shard-from-full (with ``sp`` the
blocks hold sequence shards: Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models"); ``apply_ep`` makes MoE blocks expert-parallel; :func:`apply_cp`
turns attention into ring attention; :func:`apply_recompute` wraps blocks
(``memory/recompute.py``); :func:`apply_dp` applies the data-parallel kind (``dp_kinds/``),
which :func:`build_optimizer` and :func:`finish_gradients` then ask. What does not compose is
refused by ``training_plan.py``, each rule once. Each step, and why: docs/library.md,
"Hybrid and 3D parallelism".
"""
from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.hybrid.context_parallel import (context_parallel_attention)
from reference_impl.hybrid.data_parallel import SyncReport, all_reduce_mean
from reference_impl.hybrid.expert_parallel_blocks import apply_ep
from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.memory.recompute import recompute
from reference_impl.model import Block, ModelConfig
from reference_impl.moe.expert_parallel import sync_moe_grads
from reference_impl.moe.moe_blocks import experts_of
from reference_impl.pipeline.gpt_stages import Stage, gpt_loss
from reference_impl.pipeline.pipeline_partition import (GPTEmbedding, GPTHead, gpt_layers,
                                                        layer_sizes, partition)
from reference_impl.pipeline.pipeline_schedules import Schedule
from reference_impl.tp.parallel_blocks import parallel_block
from reference_impl.tp.sequence_parallel import SEQ_DIM
from reference_impl.tp.tp_collectives import gather_from_tp, scatter_to_tp
from reference_impl.tp.vocab_parallel import (ParallelLMHead, VocabParallelEmbedding,
                                              vocab_parallel_cross_entropy)

# ---------------------------------------------------------------- the layers

class TPEmbedding(GPTEmbedding):
    """Token embedding split over the vocabulary (TP group), position embedding replicated."""

    def __init__(self, embedding: GPTEmbedding, group):
        nn.Module.__init__(self)
        self.token_embedding = VocabParallelEmbedding(embedding.token_embedding, group)
        self.position_embedding = copy.deepcopy(embedding.position_embedding)


class TPHead(GPTHead):
    """Replicated final layernorm, LM head split over the vocabulary: this rank's logits."""

    def __init__(self, head: GPTHead, group):
        nn.Module.__init__(self)
        self.ln_f = copy.deepcopy(head.ln_f)
        self.lm_head = ParallelLMHead(head.lm_head, group)


class SequenceShard(nn.Module):
    """After the embedding (sp): keep this rank's positions; the backward all-gathers them."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def forward(self, x):
        return scatter_to_tp(x, SEQ_DIM, self.group)


class SequenceWhole(SequenceShard):
    """Before the head (sp): all-gather the positions; the backward keeps this rank's."""

    def forward(self, x):
        return gather_from_tp(x, SEQ_DIM, self.group)


def tensor_parallel_layer(layer: nn.Module, group, vocab_parallel: bool = True,
                          sp: bool = False) -> nn.Module:
    """The TP (with ``sp``: sequence-parallel) version of one of ``gpt_layers``' layers."""
    if isinstance(layer, Block):  # the GPT's ParallelBlock, or the Llama parts' (llama_tp)
        if experts_of(layer)[0]:  # MoE blocks run with tp = 1 (training_plan.check_experts)
            return copy.deepcopy(layer)
        return parallel_block(layer, group, sp)
    if isinstance(layer, GPTEmbedding):
        return TPEmbedding(layer, group) if vocab_parallel else copy.deepcopy(layer)
    if isinstance(layer, GPTHead):
        return TPHead(layer, group) if vocab_parallel else copy.deepcopy(layer)
    raise TypeError(f"no tensor-parallel version of {type(layer).__name__}")


def _gpt_prefix(layer_index: int, layers: int) -> str:
    """The GPT's parameter-name prefix of layer ``layer_index`` of ``gpt_layers``: the
    embedding and the head keep the GPT's attribute names, block i is ``blocks.i.``."""
    return "" if layer_index in (0, layers - 1) else f"blocks.{layer_index - 1}."


# ---------------------------------------------------------------- the model

class ParallelGPT(nn.Module):
    """This rank's pipeline stage(s) of a GPT, made of TP layers, with what a step needs.
    Made empty by :func:`parallelize_gpt`, then filled by its ``apply_*`` steps."""

    def __init__(self, config: ModelConfig, context, plan: TrainingPlan, schedule: Schedule):
        super().__init__()
        self.context, self.config, self.plan, self.schedule = context, config, plan, schedule
        self.precision, self.vocab_parallel = plan.precision, plan.vocab_parallel
        self.bucket_bytes = plan.bucket_bytes
        self.stages = nn.ModuleDict()
        self.names: dict[int, str] = {}  # id(parameter) -> the single-device GPT's name
        self.dp_kind = plan.kind
        self.dp_state = None  # what the kind keeps: its hooks, ZeroOptimizer, device mesh
        self.experts = (0, 0)  # (experts, top_k) of the whole model's MoE blocks

    def stage_modules(self) -> dict[int, nn.Module]:
        return {int(s): module for s, module in self.stages.items()}

    def boundary_shape(self, micro_batch: int, seq_len: int) -> tuple[int, int, int]:
        """The shape of what pipeline stages exchange: a sequence shard under sp."""
        return (micro_batch, seq_len // self.context.tp if self.plan.sp else seq_len,
                self.config.hidden)

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of a micro-batch, from the whole or this rank's vocab slice."""
        if not self.vocab_parallel:
            return gpt_loss(logits, targets)
        return vocab_parallel_cross_entropy(logits, targets, self.context.groups.tp,
                                            self.config.vocab_size).mean()

    @property
    def gradient_groups(self):
        """The groups for the data-parallel reduction: the context's, with RDP standing for
        RDP x CP when there is context parallelism (each CP rank one more data shard)."""
        groups = self.context.groups
        return groups if self.plan.cp == 1 else dataclasses.replace(groups, rdp=groups.rdp_cp)

    def remap_names(self, before: dict[str, torch.Tensor]) -> None:
        """After a step replaced parameters (``before``: ``named_parameters()`` from before
        it), give each new parameter the single-device name of the one at its place."""
        self.names = {id(p): self.names[id(before[name])] for name, p in self.named_parameters()}

    def named_gpt_parameters(self):
        """(single-device GPT name, this rank's parameter) for every local parameter."""
        for parameter in self.parameters():
            yield self.names[id(parameter)], parameter

    def local_values(self) -> dict[int, torch.Tensor]:
        """{id(parameter): its value on this rank, whole over RDP}; collective where the
        data-parallel kind shards parameters (ZeRO-3, FSDP2)."""
        return self.dp_kind.full_values(self)


# ---------------------------------------------------------------- the steps

def apply_pp(gpt: nn.Module, plan: TrainingPlan, context) -> tuple[Schedule, dict]:
    """The schedule and this rank's layers: {stage: [(index in gpt_layers, layer), ...]}."""
    schedule = plan.build_schedule()
    layers = gpt_layers(gpt)  # shares gpt's parameters; apply_tp copies or shards
    ranges = partition(layer_sizes(layers), schedule.stages)
    return schedule, {s: [(i, layers[i]) for i in ranges[s]]
                      for s in schedule.stages_of(context.coordinates.pp_rank)}


def apply_tp(model: ParallelGPT, stage_layers: dict, sp: bool = False) -> None:
    """Each layer to its TP version on ``current_device()``, as ``model``'s stages; with
    ``sp``, the sequence split after the embedding and gathered before the head."""
    device, group = current_device(), model.context.groups.tp
    count = model.config.layers + 2
    for s, indexed in stage_layers.items():
        modules = []
        for i, layer in indexed:
            module = tensor_parallel_layer(layer, group, model.vocab_parallel, sp).to(device)
            for name, parameter in module.named_parameters():
                model.names[id(parameter)] = _gpt_prefix(i, count) + name
            if sp and isinstance(layer, GPTHead):
                modules.append(SequenceWhole(group))
            modules.append(module)
            if sp and isinstance(layer, GPTEmbedding):
                modules.append(SequenceShard(group))
        model.stages[str(s)] = Stage(*modules)


def apply_cp(model: ParallelGPT) -> None:
    """With ``cp`` > 1: every block's attention to ring attention over the CP group
    (``context_parallel.apply_cp``); nothing with cp = 1."""
    if model.plan.cp > 1:
        context_parallel_attention(model.stages, model.context.groups.cp)


def apply_recompute(model: ParallelGPT, mode: str) -> None:
    """Activation recomputation on every block of ``model``'s stages (none: nothing)."""
    if mode == "none":
        return
    for stage in model.stages.values():
        if any(isinstance(module, Block) for module in stage.modules()):
            recompute(stage, mode)


def apply_dp(model: ParallelGPT) -> None:
    """Prepare the data-parallel kind's reduction over RDP (RDP x CP with context parallelism):
    its hooks or its sharding (``dp_kinds/``)."""
    model.dp_kind.wrap(model)


def parallelize_gpt(gpt: nn.Module, plan: TrainingPlan, context) -> ParallelGPT:
    """This rank's part of ``gpt`` under ``plan``, laid out by ``context``
    (``plan.dims.build()``). The plan is checked against ``gpt`` unless it was already."""
    sizes = [(dims.dp, dims.tp, dims.cp, dims.pp) for dims in (plan.dims, context.dims)]
    if sizes[0] != sizes[1]:
        raise ValueError(f"the plan is {plan.dims.describe()}, the context was laid out for "
                         f"{context.dims.describe()}")
    experts = experts_of(gpt)  # of the whole model: a stage may hold no block
    plan.check(gpt.config, experts=experts[0])
    schedule, stage_layers = apply_pp(gpt, plan, context)
    model = ParallelGPT(gpt.config, context, plan, schedule)
    model.experts = experts
    apply_tp(model, stage_layers, plan.sp)
    apply_cp(model)
    apply_recompute(model, plan.recompute)
    apply_ep(model)
    apply_dp(model)
    return model


# ---------------------------------------------------------------- optimizer and gradients

def build_optimizer(model: ParallelGPT, optimizer: torch.optim.Optimizer):
    """The optimizer to step with: ``optimizer`` (over ``model.parameters()``), or what the
    data-parallel kind makes of it (ZeRO: a ``ZeroOptimizer`` with its groups and settings)."""
    return model.dp_kind.build_optimizer(model, optimizer)


def finish_gradients(model: ParallelGPT, convention: str = "megatron") -> SyncReport | None:
    """After the schedule's backwards: what is left of the data-parallel kind's reduction, then
    the sequence-parallel parameters' gradients summed over TP, so that every kind ends with
    the gradient the step will use (``grad_norm.py`` reads it). ``sync`` returns its report."""
    kind, report = model.dp_kind, None
    if convention != "megatron" and kind.name != "sync":
        raise ValueError(f"convention {convention!r} is for dp_kind sync only (got {kind.name})")
    if model.context.experts is None:
        report = kind.reduce(model, convention)
    else:  # dense over the replicas, experts over EDP (dp_kind sync: check_experts)
        sync_moe_grads(model.stages, model.context.experts)
    if model.plan.sp:
        grads = [kind.gradient(model, p) for p in model.parameters()
                 if getattr(p, "sequence_parallel", False)]
        all_reduce_mean([g for g in grads if g is not None], model.context.groups.tp, 1,
                        model.bucket_bytes)
    return report
