"""Gradient clipping by the global norm, under every layout the kit composes.

Clipping (Pascanu et al. 2013, "On the difficulty of training recurrent neural networks")
scales every gradient by min(1, max_norm / (norm + 1e-6)), where norm is the 2-norm of the
whole model's gradient: the single-device model's, whatever the layout. Each rank holds
pieces of that gradient, some of them also held by other ranks; the rule (Megatron-LM's
``clip_grad_norm``) is to add the squares of the pieces each rank *owns*, each piece owned by
exactly one rank, and sum over the ranks that hold different pieces:

* a tensor-parallel shard (a parameter marked ``tp_dim``, the mark ``tp_layers.unshard``
  reads) is owned by its rank; a parameter replicated over TP (norms, row biases, the position
  embedding, replicated KV heads, everything with ``--no-vocab-parallel``; the
  sequence-parallel ones once ``finish_gradients`` summed them) by TP rank 0 only;
* pipeline stages hold different parameters: the sum runs over MP_GROUP (TP x PP, one copy of
  the model); so do the ranks of an EP group for their experts: those squares are summed over
  the EP group first;
* data-parallel replicas and context-parallel ranks hold the same averaged gradient after
  ``finish_gradients``, so they are not summed over; except under a sharding kind (ZeRO,
  FSDP2), where each rank of its group (RDP, or RDP x CP) holds a different shard of it (the
  kind's ``gradient``, ZeRO's zero padding included): then the sum runs over that group too.

Every rank ends with the same norm and scales the gradients it holds (a 0-d tensor on the
device: the host never waits for it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from reference_impl.hybrid.expert_parallel_blocks import expert_gradients

EPSILON = 1e-6  # in the clipping coefficient, as torch.nn.utils.clip_grad_norm_


def held_gradients(model) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """(parameter, the gradient this rank holds for it) after ``finish_gradients``: ``.grad``,
    or under a sharding kind the rank's shard of the averaged gradient."""
    pairs = ((p, model.dp_kind.gradient(model, p)) for p in model.parameters())
    return [(p, grad) for p, grad in pairs if grad is not None]


def owns(parameter: torch.nn.Parameter, tp_rank: int) -> bool:
    """Whether this rank counts ``parameter``'s gradient: a TP shard always, a parameter
    replicated over TP on TP rank 0 only."""
    return tp_rank == 0 or getattr(parameter, "tp_dim", None) is not None


def norm_groups(model) -> list:
    """The groups whose ranks hold different pieces of the gradient: MP (TP x PP), and under a
    sharding kind its group (each rank a different shard). Those of one rank are skipped."""
    groups = [model.context.groups.mp, model.dp_kind.shard_group(model)]
    return [group for group in groups if group is not None and dist.get_world_size(group) > 1]


def _squares(gradients: list[torch.Tensor], device) -> torch.Tensor:
    """The sum of the gradients' squared elements (fp32, 0-d)."""
    if not gradients:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.nn.utils.get_total_norm(gradients, foreach=True).float() ** 2


def global_grad_norm(model) -> torch.Tensor:
    """The 2-norm of the single-device model's whole gradient (fp32, 0-d, on the device), on
    every rank. Collective over :func:`norm_groups`."""
    tp_rank = model.context.coordinates.tp_rank
    owned = [(p, grad) for p, grad in held_gradients(model) if owns(p, tp_rank)]
    device = owned[0][1].device if owned else next(model.parameters()).device
    dense, expert = expert_gradients(owned)
    squares = _squares(dense, device)
    if model.context.experts is not None:  # each EP rank holds other experts: sum over EP
        experts = _squares(expert, device)
        dist.all_reduce(experts, group=model.context.experts.ep)
        squares = squares + experts
    for group in norm_groups(model):
        dist.all_reduce(squares, group=group)
    return squares.sqrt()


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """min(1, max_norm / (norm + 1e-6)), as a 0-d tensor (no host sync)."""
    return torch.clamp(max_norm / (norm + EPSILON), max=1.0)


def clip_grad_norm_(model, max_norm: float) -> torch.Tensor:
    """Scale every gradient this rank holds so that the global norm is at most ``max_norm``
    (0: measure only); returns the global norm before clipping."""
    if max_norm < 0:
        raise ValueError(f"max_norm must be >= 0 (0 disables clipping), got {max_norm}")
    norm = global_grad_norm(model)
    if max_norm > 0:
        coefficient = clip_coefficient(norm, max_norm)
        for _, grad in held_gradients(model):
            grad.mul_(coefficient.to(grad.dtype))
    return norm
