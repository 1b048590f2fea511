"""``zero1``, ``zero2``, ``zero3``: ``ZeroOptimizer`` over the replicas (Rajbhandari et al.
2020, "ZeRO"): Adam's state, + gradients, + parameters sharded, each parameter flattened and
cut into equal shards (``hybrid/zero.py``)."""
from __future__ import annotations

import torch

from reference_impl.hybrid.dp_kinds.kind import DataParallelKind, Piece
from reference_impl.hybrid.zero import ZeroOptimizer

SHARDABLE = (torch.optim.Adam, torch.optim.AdamW)  # what ZeroOptimizer computes


class ZeroStage(DataParallelKind):
    def __init__(self, stage: int):
        self.stage, self.name = stage, f"zero{stage}"
        self.reduces_in_hooks = stage >= 2

    def check_optimizer(self, optimizer) -> None:
        settings = getattr(optimizer, "defaults", {})
        if type(optimizer) not in SHARDABLE or settings.get("amsgrad") or settings.get(
                "maximize"):
            raise ValueError(f"dp_kind {self.name} shards Adam's state (ZeroOptimizer: Adam or "
                             f"AdamW, without amsgrad or maximize); got "
                             f"{type(optimizer).__name__}: use Adam or AdamW (--optimizer "
                             f"adamw), or another dp_kind")

    def build_optimizer(self, model, optimizer):
        """That Adam's parameter groups and hyperparameters, on RDP (x CP) shards."""
        settings = super().build_optimizer(model, optimizer).defaults
        model.dp_state = ZeroOptimizer(
            model, model.gradient_groups.rdp, self.stage, lr=settings["lr"],
            betas=settings["betas"], eps=settings["eps"], weight_decay=settings["weight_decay"],
            decoupled_weight_decay=settings.get("decoupled_weight_decay", False),
            param_groups=optimizer.param_groups)
        return model.dp_state

    def reduce(self, model, convention: str):
        model.dp_state.reduce_gradients()  # stage 1 averages here; 2 and 3 did in the backward

    def gradient(self, model, parameter):
        return model.dp_state.shards[parameter].grad

    def shard_group(self, model):
        return model.dp_state.group

    def full_values(self, model):
        if self.stage < 3:
            return super().full_values(model)
        gathered = model.dp_state.full_state_dict()  # stage 3's storage is empty between layers
        return {id(p): gathered[name] for name, p in model.named_parameters()}

    @staticmethod
    def _own(shard, tensor) -> Piece:
        """The unpadded part of a shard-sized tensor: the rank's elements of the parameter."""
        kept = max(0, min(shard.size, shard.numel - shard.start))
        return Piece(tensor[:kept], min(shard.start, shard.numel))

    def parameter_piece(self, model, parameter) -> Piece:
        if self.stage < 3:
            return super().parameter_piece(model, parameter)
        shard = model.dp_state.shards[parameter]
        return self._own(shard, shard.master)

    def state_pieces(self, model, optimizer, parameter):
        shard = optimizer.shards[parameter]
        return {"exp_avg": self._own(shard, shard.exp_avg),
                "exp_avg_sq": self._own(shard, shard.exp_avg_sq)}

    def steps(self, optimizer, parameter) -> int:
        return optimizer.shards[parameter].step

    def start_state(self, optimizer, parameter, keys, steps: int) -> None:
        optimizer.shards[parameter].step = steps  # the moments exist from the start
