"""The validation loss of a parallel GPT: one forward, no gradients, under any layout.

The pipeline's stages run in order, a chain of point-to-point messages (GPipe's forward with
one micro-batch: no backward to interleave, so no schedule is needed); TP, SP, CP and EP run
inside the stages as in training, and ZeRO-3 and FSDP2 gather their parameters in the forward
as they do there (FSDP2's root units then shard theirs again: ``after_forward_only``). The
last stage's loss is broadcast over the pipeline, then averaged over the dp x cp shards
(``parallel_gpt.mean_over_shards``), so every rank returns the global batch's mean loss, the
single-device model's on the same batch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device
from reference_impl.hybrid.parallel_gpt import ParallelGPT, mean_over_shards
from reference_impl.model.precision import autocast


@torch.no_grad()
def evaluate(model: ParallelGPT, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean loss of the global batch whose share on this rank is (tokens, targets)
    (``replica_slice``'s); a 0-d tensor on this rank's device, the same on every rank."""
    schedule, group, device = model.schedule, model.context.groups.pp, current_device()
    tokens, targets = tokens.to(device), targets.to(device)
    me, last = dist.get_rank(group), schedule.stages - 1
    shape = model.boundary_shape(tokens.shape[0], tokens.shape[1])
    loss = torch.zeros((), device=device)
    x = None
    for stage in range(schedule.stages):
        owner = schedule.rank_of(stage)
        if stage > 0 and owner != schedule.rank_of(stage - 1):  # a message between ranks
            previous = dist.get_global_rank(group, schedule.rank_of(stage - 1))
            if owner == me:
                x = torch.empty(shape, device=device)
                dist.recv(x, src=previous, group=group)
            elif schedule.rank_of(stage - 1) == me:
                dist.send(x.float().contiguous(), dst=dist.get_global_rank(group, owner),
                          group=group)
        if owner != me:
            continue
        with autocast(model.precision, device):
            x = model.stages[str(stage)](tokens if stage == 0 else x)
            if stage == last:
                loss = model.loss_fn(x, targets).float()
    model.dp_kind.after_forward_only(model)
    dist.broadcast(loss, src=dist.get_global_rank(group, schedule.rank_of(last)), group=group)
    return mean_over_shards(loss, model.context)
