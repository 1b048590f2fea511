"""Layout-independent checkpoints of a 3D (dp x tp x pp) run.

A checkpoint is **one file in the single-device GPT's names**, whatever the layout that wrote it:

    {"format": "gpt-3d-checkpoint/1",
     "step": 3,                                  # optimizer steps done = data position
     "config": {"vocab_size": ..., ...},         # ModelConfig fields
     "model": {"blocks.0.attn.qkv.weight": full tensor, ...},      # GPT.state_dict() names
     "optimizer": {"kind": "adamw", "hyper": {...}, "schedule": {"lr": ..., ...},
                   "state": {"blocks.0.attn.qkv.weight": {"exp_avg": full, "step": t}, ...}},
     "data": {"seed": 0, "batch": 16, "seq": 32, "vocab": 128},    # make_dataset's arguments
     "rng": torch.get_rng_state(),
     "layout": {"dp": 2, "tp": 2, "pp": 2}}      # the writer's, for information only

Why gathered and not one shard file per rank: a gathered file loads into **any** layout
(save 2x2x2, resume 1x2x4) and straight into a single-device ``model.GPT``
(``GPT(ModelConfig(**ckpt["config"])).load_state_dict(ckpt["model"])``), with no
re-sharding tool. The price is that rank 0 holds the whole model and optimizer state once
while saving, which is fine at this course's sizes (a sharded format, as
``torch.distributed.checkpoint`` writes, is what you would use for a model that does not fit
in one host's memory).

* :func:`gather_optimizer_state` unshards every optimizer state tensor that has its
  parameter's shape (Adam's ``exp_avg``/``exp_avg_sq``, SGD's ``momentum_buffer``) exactly as
  ``parallel_3d.gather_full_state`` unshards the parameter (over the TP group, vocabulary padding
  dropped, stages collected over the PP group); scalars (Adam's ``step``) are kept as they are.
* :func:`load_optimizer_state` re-shards them for the *current* layout by the same
  shard-from-full path as the weights: it builds the 3D model from a GPT whose "weights" are
  one state tensor (e.g. every ``exp_avg``) and takes the local shards from it. So optimizer
  state is sharded by exactly the code that shards the parameters, in every layout.
* :func:`save` is called on every rank (the gathers are collective); only rank 0 writes, to a
  temporary file then renamed, so a crash mid-write never leaves a broken checkpoint.
* :func:`load` reads the file on rank 0 only and broadcasts it, so on a multi-node run only
  rank 0's node needs to see the checkpoint directory.

Files are written with ``torch.save`` and read with ``torch.load(weights_only=True)``: the
content is tensors, numbers, strings and dicts only.
"""
from __future__ import annotations

import copy
import dataclasses
import os

import torch
import torch.distributed as dist

from reference_impl.hybrid import parallel_3d
from reference_impl.model import GPT, ModelConfig
from reference_impl.tp.tp_layers import unshard

FORMAT = "gpt-3d-checkpoint/1"
FILENAME = "checkpoint.pt"
_VOCAB_ROWS = ("token_embedding.weight", "lm_head.weight")  # padded to a multiple of tp


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, FILENAME)


# ---------------------------------------------------------------- gather (save side)

def gather_optimizer_state(model: parallel_3d.Parallel3DModel,
                           optimizer: torch.optim.Optimizer) -> dict[str, dict]:
    """{GPT parameter name: {state key: full tensor or scalar}}, on every rank. Collective over
    the TP and PP groups, like ``parallel_3d.gather_full_state``."""
    if not isinstance(optimizer, torch.optim.Optimizer):  # e.g. ZeRO's, over RDP shards
        raise ValueError(f"cannot checkpoint a {type(optimizer).__name__}: the gathered format "
                         f"reads torch.optim state only (dp_kind sync or ddp_hooks)")
    groups, vocab = model.context.groups, model.config.vocab_size
    local = {}
    for name, parameter in model.named_gpt_parameters():  # same order on every TP peer
        state = {}
        for key in sorted(optimizer.state.get(parameter, {})):
            value = optimizer.state[parameter][key]
            if torch.is_tensor(value) and value.shape == parameter.shape and value.dim() > 0:
                full = unshard(value.detach(), parameter, groups.tp).cpu()
                if name in _VOCAB_ROWS:
                    full = full[:vocab]
                state[key] = full.clone()
            else:
                state[key] = value.detach().cpu().clone() if torch.is_tensor(value) else value
        local[name] = state
    if model.context.pp == 1:
        return local
    stages: list = [None] * model.context.pp
    dist.all_gather_object(stages, local, group=groups.pp)
    return {name: state for stage in stages for name, state in stage.items()}


def save(directory: str, model: parallel_3d.Parallel3DModel, optimizer: torch.optim.Optimizer,
         step: int, optimizer_info: dict, data: dict) -> str | None:
    """Gather the run's state (every rank must call this) and write it from rank 0.

    ``optimizer_info``: {"kind": "adamw"|"sgd", "hyper": {...}, "schedule": {...}}, checked on
    load (the learning rate of every step is the schedule's at that step: no scheduler state);
    ``data``: the dataset's arguments, so a resume can check it continues the same stream.
    Returns the file's path on rank 0, None elsewhere."""
    full_model = parallel_3d.gather_full_state(model)
    full_optimizer = gather_optimizer_state(model, optimizer)
    if dist.get_rank() != 0:
        return None
    context = model.context
    checkpoint = {
        "format": FORMAT,
        "step": step,
        "config": dataclasses.asdict(model.config),
        "model": full_model,
        "optimizer": {**optimizer_info, "state": full_optimizer},
        "data": dict(data),
        "rng": torch.get_rng_state(),
        "layout": {"dp": context.dp, "tp": context.tp, "pp": context.pp},
    }
    os.makedirs(directory, exist_ok=True)
    path = checkpoint_path(directory)
    temporary = path + ".tmp"
    torch.save(checkpoint, temporary)
    os.replace(temporary, path)  # atomic: readers see the old file or the new one
    return path


# ---------------------------------------------------------------- load side

def read(path: str) -> dict:
    """The checkpoint at ``path`` (no process group needed: e.g. for a single-device GPT)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} checkpoint")
    return checkpoint


def load(directory: str) -> dict | None:
    """The checkpoint in ``directory`` on every rank (read on rank 0, broadcast), or None when
    there is none. Collective over the default group."""
    box = [None]
    if dist.get_rank() == 0:
        path = checkpoint_path(directory)
        box[0] = read(path) if os.path.exists(path) else None
    dist.broadcast_object_list(box, src=0)
    return box[0]


def single_device_gpt(checkpoint: dict) -> GPT:
    """A plain ``model.GPT`` with the checkpoint's weights."""
    gpt = GPT(ModelConfig(**checkpoint["config"]))
    gpt.load_state_dict(checkpoint["model"])
    return gpt


def load_optimizer_state(model: parallel_3d.Parallel3DModel, optimizer: torch.optim.Optimizer,
                         gpt: GPT, full_state: dict[str, dict], **build_options) -> None:
    """Put ``full_state`` (from :func:`gather_optimizer_state`, any layout) into ``optimizer``,
    sharded for ``model``'s layout. ``gpt`` is a GPT of the model's shape and
    ``build_options`` the ``build_3d_gpt`` arguments ``model`` was built with."""
    local = dict(model.named_gpt_parameters())
    missing = set(local) - set(full_state)
    if missing:
        raise ValueError(f"the checkpoint has no optimizer state for {sorted(missing)}")
    keys = sorted({key for state in full_state.values() for key in state})
    for key in keys:
        tensors = {name: state[key] for name, state in full_state.items()
                   if key in state and torch.is_tensor(state[key]) and state[key].dim() > 0}
        shards = {}
        if tensors:  # shard-from-full: a GPT whose weights are this state tensor
            carrier = copy.deepcopy(gpt)
            carrier.load_state_dict(tensors, strict=False)
            sharded = parallel_3d.build_3d_gpt(carrier, model.context, model.schedule.microbatches,
                                          model.schedule, vocab_parallel=model.vocab_parallel,
                                          **build_options)
            shards = dict(sharded.named_gpt_parameters())
        for name, parameter in local.items():
            value = full_state[name].get(key)
            if value is None:
                continue
            if name in tensors:
                value = shards[name].detach().clone().to(parameter.device)
            elif torch.is_tensor(value):
                value = value.clone()
            optimizer.state[parameter][key] = value
