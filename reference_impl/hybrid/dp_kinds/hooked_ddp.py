"""``ddp_hooks``: all-reduces launched from gradient hooks during the backward (Li et al. 2020,
"PyTorch Distributed"), during the last micro-batch's backward of a step."""
from __future__ import annotations

from torch import nn

from reference_impl.hybrid.ddp_hooks import OverlappingDataParallel
from reference_impl.hybrid.dp_kinds.kind import DataParallelKind


class AccumulatingDataParallel(OverlappingDataParallel):
    """DDP hooks for a step of ``microbatches`` backwards: a parameter counts as ready at its
    last micro-batch's gradient, so the buckets travel during the last backward with the whole
    step's gradient (as Megatron-LM overlaps its reduction with a pipeline's last backward)."""

    def __init__(self, module, group, bucket_bytes: int, microbatches: int):
        super().__init__(module, group, bucket_bytes)
        self.microbatches, self._arrived = microbatches, {}

    def _gradient_ready(self, param: nn.Parameter) -> None:
        arrived = self._arrived.get(param, 0) + 1
        self._arrived[param] = arrived % self.microbatches
        if arrived == self.microbatches:
            super()._gradient_ready(param)


class HookedDDP(DataParallelKind):
    name = "ddp_hooks"
    reduces_in_hooks = True

    def wrap(self, model) -> None:
        hooks = AccumulatingDataParallel(model.stages, model.gradient_groups.rdp,
                                         model.bucket_bytes or 0, model.schedule.microbatches)
        object.__setattr__(model, "dp_state", hooks)  # beside the model, not a submodule

    def reduce(self, model, convention: str):
        model.dp_state.finish_gradient_sync()
