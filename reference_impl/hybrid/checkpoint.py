"""Sharded checkpoints of a parallel run, through ``torch.distributed.checkpoint`` (DCP): every
rank writes the part of the state it holds, and a run under another data-parallel layout (dp,
pp, cp, the data-parallel kind: sync, DDP hooks, ZeRO 1-3, FSDP2) reads back exactly its part.

``DIR/checkpoint/`` holds DCP's files (one per rank and ``.metadata``) and ``run.pt``, the run's
facts (step, model config and experts, optimizer and schedule, data stream, RNG state, the writer's layout,
each parameter's shapes and TP split, each parameter's optimizer step count).

Each tensor is stored as ``(rows, numel)``: row ``t`` is TP rank ``t``'s shard flattened (one
row for a parameter replicated over TP); each rank holds a run of a row's elements, as its
data-parallel kind gives it (``dp_kinds/kind.Piece``). So the rows tie a checkpoint to its TP
degree (and vocabulary split); everything else may change on resume. :func:`single_device_state`
joins the rows back into the single-device GPT's tensors, with no process group.

A save writes into ``checkpoint.tmp`` and renames it once every rank is done, so a crash never
leaves a broken checkpoint. DCP reads and writes files on every rank: the directory must be on
a file system every node sees.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from reference_impl.hybrid.checkpoint_pieces import FlatPiece, PieceLoadPlanner, PieceSavePlanner
from reference_impl.model import GPT, ModelConfig
from reference_impl.moe.moe_blocks import with_experts

FORMAT = "gpt-sharded-checkpoint/2"
FOLDER, RUN_FILE = "checkpoint", "run.pt"
_VOCAB_ROWS = ("token_embedding.weight", "lm_head.weight")  # padded to a multiple of tp


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, FOLDER)


def _tensor_facts(model, parameter) -> dict:
    """How ``parameter`` (this rank's TP shard) sits in the single-device tensor."""
    dim, tp = getattr(parameter, "tp_dim", None), model.context.tp
    return {"local_shape": list(parameter.shape), "tp_dim": dim,
            "tp_blocks": getattr(parameter, "tp_blocks", 1), "rows": 1 if dim is None else tp}


def _pieces(model, optimizer) -> dict[str, FlatPiece]:
    """{DCP key: what this rank holds}: every parameter and optimizer state tensor."""
    kind, tp_rank, pieces = model.dp_kind, model.context.coordinates.tp_rank, {}
    for name, parameter in model.named_gpt_parameters():
        rows = _tensor_facts(model, parameter)["rows"]
        held = {f"model/{name}": kind.parameter_piece(model, parameter)}
        held.update({f"optimizer/{name}/{key}": piece for key, piece in
                     kind.state_pieces(model, optimizer, parameter).items()})
        for key, piece in held.items():
            if piece.flat.numel():  # a ZeRO rank past the last element holds nothing
                pieces[key] = FlatPiece(piece.flat, tp_rank if rows > 1 else 0, rows,
                                        piece.start, parameter.numel())
    return pieces


def save(directory: str, model, optimizer, step: int, optimizer_info: dict,
         data: dict) -> str | None:
    """Write the run's state at ``step`` (every rank calls this; each writes its part).
    ``optimizer_info``: {"kind", "hyper", "schedule"}; ``data``: the dataset's arguments.
    Returns the checkpoint's path on rank 0, None elsewhere."""
    final = checkpoint_path(directory)
    temporary = final + ".tmp"
    if dist.get_rank() == 0:
        shutil.rmtree(temporary, ignore_errors=True)
        os.makedirs(temporary)
    dist.barrier()
    dcp.save(_pieces(model, optimizer), checkpoint_id=temporary, planner=PieceSavePlanner())
    kind = model.dp_kind
    mine = {name: (_tensor_facts(model, p), kind.steps(optimizer, p),
                   sorted(kind.state_pieces(model, optimizer, p)))
            for name, p in model.named_gpt_parameters()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        facts = {name: fact for rank in everyone for name, fact in rank.items()}
        context, plan = model.context, model.plan
        torch.save({
            "format": FORMAT, "step": step, "config": dataclasses.asdict(model.config),
            "experts": list(model.experts),
            "optimizer": dict(optimizer_info), "data": dict(data), "rng": torch.get_rng_state(),
            "layout": {"dp": context.dp, "tp": context.tp, "pp": context.pp, "cp": context.cp,
                       "dp_kind": plan.dp_kind, "vocab_parallel": plan.vocab_parallel},
            "tensors": {name: fact[0] for name, fact in facts.items()},
            "steps": {name: fact[1] for name, fact in facts.items()},
            "state_keys": {name: fact[2] for name, fact in facts.items()},
        }, os.path.join(temporary, RUN_FILE))
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(temporary, final)
    dist.barrier()
    return final if dist.get_rank() == 0 else None


def read_run(directory: str) -> dict | None:
    """The run's facts of the checkpoint in ``directory`` (None when there is none)."""
    path = os.path.join(checkpoint_path(directory), RUN_FILE)
    if not os.path.exists(path):
        return None
    run = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(run, dict) or run.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} checkpoint")
    return run


def check_layout(run: dict, tp: int, vocab_parallel: bool) -> None:
    """A checkpoint's rows are its TP shards: the TP degree and vocabulary split must match."""
    saved = run["layout"]
    here = {"tp": tp, "vocab_parallel": vocab_parallel}
    for what, value in here.items():
        if saved[what] != value:
            raise ValueError(
                f"cannot resume: the checkpoint was written with {what} = {saved[what]}, this "
                f"run has {what} = {value}; a sharded checkpoint keeps its TP shards, so it "
                f"resumes under another dp, pp, cp or data-parallel kind, not another tp")


def load(directory: str, run: dict, model, optimizer) -> None:
    """Read this rank's part of the checkpoint into ``model`` and ``optimizer`` (every rank
    calls this), whatever data-parallel layout wrote it."""
    check_layout(run, model.context.tp, model.plan.vocab_parallel)
    kind = model.dp_kind
    for name, parameter in model.named_gpt_parameters():
        kind.start_state(optimizer, parameter, run["state_keys"][name], run["steps"][name])
    with torch.no_grad():
        dcp.load(_pieces(model, optimizer), checkpoint_id=checkpoint_path(directory),
                 planner=PieceLoadPlanner())


# ---------------------------------------------------------------- one device, no group

def _join(rows: torch.Tensor, facts: dict) -> torch.Tensor:
    """The single-device tensor from its TP shards' rows (``tp_layers.shard``'s inverse: each
    shard holds its piece of every block, the full tensor lists block by block)."""
    shards = [row.view(facts["local_shape"]) for row in rows]
    if facts["tp_dim"] is None:
        return shards[0]
    dim, blocks = facts["tp_dim"], facts["tp_blocks"]
    pieces = [shard.chunk(blocks, dim=dim) for shard in shards]
    return torch.cat([pieces[t][b] for b in range(blocks) for t in range(len(shards))], dim=dim)


def single_device_state(directory: str) -> tuple[dict, dict, dict]:
    """(the run's facts, the GPT's ``state_dict``, {name: {optimizer state key: tensor,
    "step": n}}) of the checkpoint in ``directory``, read in this process alone."""
    run = read_run(directory)
    if run is None:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    path = checkpoint_path(directory)
    reader = dcp.FileSystemReader(path)
    stored = reader.read_metadata().state_dict_metadata
    rows = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
            for key, meta in stored.items()}
    with warnings.catch_warnings():  # DCP warns that it reads in one process: meant here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(rows, storage_reader=reader, no_dist=True)
    vocab = run["config"]["vocab_size"]

    def full(key: str, name: str) -> torch.Tensor:
        tensor = _join(rows[key], run["tensors"][name])
        return tensor[:vocab] if name in _VOCAB_ROWS else tensor

    model = {name: full(f"model/{name}", name) for name in run["tensors"]}
    optimizer = {name: {**{key: full(f"optimizer/{name}/{key}", name) for key in keys},
                        "step": run["steps"][name]}
                 for name, keys in run["state_keys"].items()}
    return run, model, optimizer


def single_device_gpt(directory: str) -> GPT:
    """A plain ``model.GPT`` with the checkpoint's weights."""
    run, state, _ = single_device_state(directory)
    gpt = GPT(ModelConfig(**run["config"]))
    if run["experts"][0]:
        with_experts(gpt, *run["experts"])
    gpt.load_state_dict(state)
    return gpt
