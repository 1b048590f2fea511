"""``fsdp2``: PyTorch's ``fully_shard`` (FSDP2: Zhao et al. 2023, "PyTorch FSDP"; its per-parameter
DTensor sharding) over the replicas' device mesh: each parameter, gradient and optimizer state
cut along dim 0 into one row block per rank; a block's parameters all-gathered for its forward
and backward, its gradients reduce-scattered (averaged) in the backward. The memory of
ZeRO-3, with torch's own optimizers.
"""
from __future__ import annotations

import math

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard

from reference_impl.hybrid.dp_kinds.kind import DataParallelKind, Piece
from reference_impl.model import Block


def _carry_marks(before: dict, module) -> None:
    """``fully_shard`` replaces each parameter by a DTensor one: keep the kit's marks on it
    (``tp_dim``, ``tp_blocks``, ``sequence_parallel``: what TP, SP and clipping read)."""
    for name, parameter in module.named_parameters():
        for mark, value in vars(before[name]).items():
            if not hasattr(parameter, mark):
                setattr(parameter, mark, value)


class FullyShardedFSDP2(DataParallelKind):
    name = "fsdp2"
    reduces_in_hooks = True

    def wrap(self, model) -> None:
        """Each block its own FSDP unit, then each stage (its embedding, head), on the mesh of
        the replicas (RDP, or RDP x CP: the context's ``replica_mesh``)."""
        mesh = model.context.replica_mesh()
        before = dict(model.named_parameters())
        for stage in model.stages.values():
            for module in stage.modules():
                if isinstance(module, Block):
                    fully_shard(module, mesh=mesh)
            fully_shard(stage, mesh=mesh)
        _carry_marks(before, model)
        model.remap_names(before)
        model.dp_state = mesh

    def after_forward_only(self, model) -> None:
        """The root units keep their parameters gathered after the forward, for the backward
        that would follow; with none coming, shard them again (every unit, to be sure)."""
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def reduce(self, model, convention: str):
        return None  # reduce-scattered in the backward

    def gradient(self, model, parameter):
        return None if parameter.grad is None else parameter.grad.to_local()

    def shard_group(self, model):
        return model.dp_state.get_group()

    def full_values(self, model):
        return {id(p): p.full_tensor().detach() for p in model.parameters()}

    @staticmethod
    def _piece(model, parameter, local: torch.Tensor) -> Piece:
        """The rank's row block, in flat coordinates (torch.chunk's blocks along dim 0)."""
        rows, ranks = parameter.shape[0], model.dp_state.size()
        first = min(model.dp_state.get_local_rank() * math.ceil(rows / ranks), rows)
        return Piece(local.view(-1), first * (parameter.numel() // max(rows, 1)))

    def parameter_piece(self, model, parameter) -> Piece:
        return self._piece(model, parameter, parameter.to_local().detach())

    def state_pieces(self, model, optimizer, parameter):
        state = optimizer.state.get(parameter, {})
        return {key: self._piece(model, parameter, value.to_local())
                for key, value in state.items()
                if torch.is_tensor(value) and value.shape == parameter.shape}
