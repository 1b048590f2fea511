"""Compose the kit's parallelisms on the course's GPT, one small step each (the API shape of
torchtitan's ``parallelize_llama``: apply_pp, apply_tp, apply_ac, apply_fsdp / apply_ddp).

    dims = ParallelDims(dp=2, tp=2, sp=True, dp_kind="zero1", recompute="selective")
    context = parallel_3d.initialize_parallelism(dims.dp, dims.tp, dims.pp, cp=dims.cp)
    model = parallelize_gpt(gpt, dims, context)             # this rank's part of gpt
    optimizer = build_optimizer(model, lambda params: torch.optim.AdamW(params, lr=3e-4))
    loss = parallel_3d.train_step(model, tokens, targets, optimizer, max_norm=1.0)

The steps, in the order :func:`parallelize_gpt` runs them:

* :func:`apply_pp` cuts ``gpt_layers(gpt)`` (embedding, blocks, head) into the schedule's
  stages by parameter count and keeps this rank's layers (references: nothing copied yet).
* :func:`apply_tp` turns each kept layer into its tensor-parallel version, shard-from-full, on
  ``current_device()``: ``ParallelBlock`` (``SequenceParallelBlock`` with ``sp``) or, for a
  block with Llama parts (``llama_blocks``), ``llama_tp.ParallelLlamaBlock``, the
  vocabulary-parallel embedding and head. With ``sp`` (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", section 4.2.2) everything between the
  embedding and the final layernorm is this rank's sequence shard: the embedding's output is
  split along the sequence (``scatter_to_tp``), the head's input gathered (``gather_from_tp``),
  so pipeline stages exchange (micro_batch, seq / tp, hidden).
* :func:`apply_cp` (with ``cp`` > 1, ``context_parallel.py``): each block's attention becomes
  ring attention over the CP group; :func:`parallel_3d.train_step` gives each CP rank its
  load-balanced share of the sequence, and the gradients below are reduced over RDP x CP.
* :func:`apply_recompute`: ``memory/recompute.py`` on every block, ``selective`` (the attention
  core) or ``full`` (the whole block; same paper, section 5).
* :func:`apply_dp`: how the replicas' gradients become the global batch's (``dp_kind``):

      sync       after the backward, a bucketed all-reduce over RDP (``data_parallel``)
      ddp_hooks  all-reduces launched from gradient hooks during the backward (Li et al.
                 2020, "PyTorch Distributed"), in the last micro-batch's backward
      zero1..3   ``ZeroOptimizer`` over RDP (Rajbhandari et al. 2020, "ZeRO"), made by
                 :func:`build_optimizer`: Adam's state, + gradients, + parameters sharded

  Under every kind the sequence-parallel parameters' gradients (layernorms, row biases) are
  then summed over the TP group (:func:`finish_gradients`); ``grad_norm.py`` clips the result
  by the global norm, counting each piece of the gradient once under every layout.

What does not compose is refused by :class:`ParallelDims` with the rule and the numbers:
``sp`` without ``tp > 1``; a sequence, head count or hidden size that ``tp`` does not divide;
KV heads ``tp`` neither divides nor is divided by (``llama_tp.kv_head_layout``); ``cp`` with
learned positions or a sequence not divisible by 2cp (``context_parallel.py``); selective
recomputation of grouped-query attention (``recompute.py`` re-implements the GPT's attention);
the hook-driven kinds (ddp_hooks, zero2, zero3) with a split-backward schedule (zb-h1: its W
adds the weight gradients without autograd, so no hook sees them); ZeRO with another optimizer
than Adam or AdamW (:func:`build_optimizer`). Everything else composes, zero3 with full recomputation
included (a layer recomputed in the backward gathers its parameters again, as in its forward).
"""
from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.hybrid.context_parallel import (context_parallel_attention)
from reference_impl.hybrid.data_parallel import (SyncReport,
                                                 all_reduce_mean, sync_gradients)
from reference_impl.hybrid.ddp_hooks import OverlappingDataParallel
from reference_impl.hybrid.parallel_dims import DP_KINDS, RECOMPUTE_MODES, ZERO_STAGES, ParallelDims
from reference_impl.hybrid.zero import ZeroOptimizer
from reference_impl.memory.recompute import recompute
from reference_impl.model import Block, ModelConfig
from reference_impl.pipeline.gpt_stages import Stage, gpt_loss
from reference_impl.pipeline.pipeline_partition import (GPTEmbedding, GPTHead, gpt_layers,
                                                        layer_sizes, partition)
from reference_impl.pipeline.pipeline_schedules import Schedule
from reference_impl.tp.llama_tp import parallel_block
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

class Parallel3DModel(nn.Module):
    """This rank's pipeline stage(s) of a GPT, made of TP layers, with what a step needs.
    Made empty by :func:`parallelize_gpt`, then filled by its ``apply_*`` steps."""

    def __init__(self, config: ModelConfig, context, dims: ParallelDims, schedule: Schedule):
        super().__init__()
        self.context, self.config, self.dims, self.schedule = context, config, dims, schedule
        self.precision, self.vocab_parallel = dims.precision, dims.vocab_parallel
        self.bucket_bytes = dims.bucket_bytes
        self.stages = nn.ModuleDict()
        self.names: dict[int, str] = {}  # id(parameter) -> the single-device GPT's name
        self.gradient_hooks: OverlappingDataParallel | None = None  # ddp_hooks
        self.zero: ZeroOptimizer | None = None  # zero1-3, set by build_optimizer

    def stage_modules(self) -> dict[int, nn.Module]:
        return {int(s): module for s, module in self.stages.items()}

    def boundary_shape(self, micro_batch: int, seq_len: int) -> tuple[int, int, int]:
        """The shape of what pipeline stages exchange: a sequence shard under sp."""
        return (micro_batch, seq_len // self.context.tp if self.dims.sp else seq_len,
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
        return groups if self.dims.cp == 1 else dataclasses.replace(groups, rdp=groups.rdp_cp)

    def named_gpt_parameters(self):
        """(single-device GPT name, this rank's parameter) for every local parameter."""
        for parameter in self.parameters():
            yield self.names[id(parameter)], parameter

    def local_values(self) -> dict[int, torch.Tensor]:
        """{id(parameter): its value on this rank}; under ZeRO-3 all-gathered over RDP
        (collective there), since between layers a parameter's storage is empty."""
        if self.zero is None or self.zero.stage < 3:
            return {id(p): p.detach() for p in self.parameters()}
        gathered = self.zero.full_state_dict()
        return {id(p): gathered[name] for name, p in self.named_parameters()}


# ---------------------------------------------------------------- the steps

def apply_pp(gpt: nn.Module, dims: ParallelDims, context) -> tuple[Schedule, dict]:
    """The schedule and this rank's layers: {stage: [(index in gpt_layers, layer), ...]}."""
    schedule = dims.build_schedule()
    layers = gpt_layers(gpt)  # shares gpt's parameters; apply_tp copies or shards
    ranges = partition(layer_sizes(layers), schedule.stages)
    return schedule, {s: [(i, layers[i]) for i in ranges[s]]
                      for s in schedule.stages_of(context.coordinates.pp_rank)}


def apply_tp(model: Parallel3DModel, stage_layers: dict, sp: bool = False) -> None:
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


def apply_cp(model: Parallel3DModel) -> None:
    """With ``cp`` > 1: every block's attention to ring attention over the CP group
    (``context_parallel.apply_cp``); nothing with cp = 1."""
    if model.dims.cp > 1:
        context_parallel_attention(model.stages, model.context.groups.cp)


def apply_recompute(model: Parallel3DModel, mode: str) -> None:
    """Activation recomputation on every block of ``model``'s stages (none: nothing)."""
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {mode!r}")
    if mode == "none":
        return
    for stage in model.stages.values():
        if any(isinstance(module, Block) for module in stage.modules()):
            recompute(stage, mode)


class _AccumulatingDataParallel(OverlappingDataParallel):
    """DDP hooks for a step of ``microbatches`` backwards: a parameter counts as ready at its
    last micro-batch's gradient, so the buckets travel during the last backward, with the
    whole step's gradient (as Megatron-LM overlaps its reduction with a pipeline's last
    backward; ``no_sync`` for the others)."""

    def __init__(self, module, group, bucket_bytes: int, microbatches: int):
        super().__init__(module, group, bucket_bytes)
        self.microbatches, self._arrived = microbatches, {}

    def _gradient_ready(self, param: nn.Parameter) -> None:
        arrived = self._arrived.get(param, 0) + 1
        self._arrived[param] = arrived % self.microbatches
        if arrived == self.microbatches:
            super()._gradient_ready(param)


def apply_dp(model: Parallel3DModel, kind: str) -> None:
    """Prepare the gradient reduction ``kind`` over the RDP group, RDP x CP with context
    parallelism (ddp_hooks: install the hooks; sync: nothing, :func:`finish_gradients`
    reduces; zero: :func:`build_optimizer`)."""
    if kind not in DP_KINDS:
        raise ValueError(f"dp_kind must be one of {', '.join(DP_KINDS)}, got {kind!r}")
    if kind == "ddp_hooks":  # kept beside the model, not as a submodule of it
        object.__setattr__(model, "gradient_hooks", _AccumulatingDataParallel(
            model.stages, model.gradient_groups.rdp, model.bucket_bytes or 0,
            model.schedule.microbatches))


def parallelize_gpt(gpt: nn.Module, dims: ParallelDims, context) -> Parallel3DModel:
    """This rank's part of ``gpt`` under ``dims`` (laid out by ``context``, from
    ``parallel_3d.initialize_parallelism(dims.dp, dims.tp, dims.pp, cp=dims.cp)``)."""
    wanted = (dims.dp, dims.tp, dims.cp, dims.pp)
    laid_out = (context.dp, context.tp, context.cp, context.pp)
    if laid_out != wanted:
        raise ValueError("dims are dp x tp x cp x pp = {} x {} x {} x {}, the context was laid "
                         "out for {} x {} x {} x {}".format(*wanted, *laid_out))
    dims.check_model(gpt.config)
    schedule, stage_layers = apply_pp(gpt, dims, context)
    model = Parallel3DModel(gpt.config, context, dims, schedule)
    apply_tp(model, stage_layers, dims.sp)
    apply_cp(model)
    apply_recompute(model, dims.recompute)
    apply_dp(model, dims.dp_kind)
    return model


# ---------------------------------------------------------------- optimizer and gradients

SHARDABLE = (torch.optim.Adam, torch.optim.AdamW)  # what ZeroOptimizer computes


def build_optimizer(model: Parallel3DModel, make_optimizer):
    """``make_optimizer(model.parameters())``; for zero1-3 a ``ZeroOptimizer`` over RDP (RDP x
    CP with context parallelism) with that Adam's or AdamW's parameter groups and
    hyperparameters instead (ZeRO shards Adam's state: another optimizer, or Adam with
    amsgrad or maximize, is refused)."""
    optimizer = make_optimizer(model.parameters())
    kind = model.dims.dp_kind
    if kind not in ZERO_STAGES:
        return optimizer
    settings = optimizer.defaults
    if type(optimizer) not in SHARDABLE or settings.get("amsgrad") or settings.get("maximize"):
        raise ValueError(f"dp_kind {kind} shards Adam's state (ZeroOptimizer: Adam or AdamW, "
                         f"without amsgrad or maximize); got {type(optimizer).__name__}: use "
                         f"Adam or AdamW, or dp_kind sync or ddp_hooks")
    model.zero = ZeroOptimizer(model, model.gradient_groups.rdp, ZERO_STAGES[kind],
                               lr=settings["lr"], betas=settings["betas"], eps=settings["eps"],
                               weight_decay=settings["weight_decay"],
                               decoupled_weight_decay=settings.get("decoupled_weight_decay",
                                                                   False),
                               param_groups=optimizer.param_groups)
    return model.zero


def finish_gradients(model: Parallel3DModel, convention: str = "megatron") -> SyncReport | None:
    """After the schedule's backwards: make every gradient the global batch's (what is left of
    ``dp_kind``'s reduction), sum the sequence-parallel parameters' gradients over TP, and under
    ZeRO-1 average over RDP into the gradient shards (``ZeroOptimizer.reduce_gradients``), so
    that every kind ends with what the step will use (``grad_norm.py`` reads it). ``sync``
    returns its report, the others None."""
    kind, report = model.dims.dp_kind, None
    if convention != "megatron" and kind != "sync":
        raise ValueError(f"convention {convention!r} is for dp_kind sync only (got {kind})")
    if kind == "sync":
        report = sync_gradients(list(model.stages.values()), model.gradient_groups,
                                convention, model.bucket_bytes)
    elif kind == "ddp_hooks":
        model.gradient_hooks.finish_gradient_sync()
    if model.dims.sp:
        sharded = model.zero is not None and model.zero.stage >= 2  # ZeRO keeps the shard
        grads = [model.zero.shards[p].grad if sharded else p.grad for p in model.parameters()
                 if getattr(p, "sequence_parallel", False)]
        all_reduce_mean([g for g in grads if g is not None], model.context.groups.tp, 1,
                        model.bucket_bytes)
    if model.zero is not None:
        model.zero.reduce_gradients()
    return report
