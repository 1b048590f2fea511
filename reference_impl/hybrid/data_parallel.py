"""Data-parallel gradient synchronisation for hybrid (TP x PP x DP) parallelism.

After the backward every rank holds the gradients of its own samples; :func:`sync_gradients`
makes them the gradients of the global batch. Which group sums a gradient, and what to divide
by, depends on whether the parameter is TP-distributed (carries ``tp_dim``, or shares a module
with one that does) and on which samples a TP group's ranks hold: the rule of the SageMaker
model parallelism library's "Ranking Mechanism" page (distributed over RDP_GROUP, replicated
over DP_GROUP) for SageMaker's layout, where TP peers hold different samples, and every
gradient over RDP_GROUP for Megatron-LM's, where they share them. Either way, divide by the
number of distinct data shards. The all-reduces are bucketed, as DDP and Megatron do.

The table of both conventions and why: lab 5's notebook, "3. Which group, and what to divide
by"; the wrong group's cost and the buckets: ``docs/library.md``, "Hybrid and 3D parallelism".
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

CONVENTIONS = ("sagemaker", "megatron")
DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb = 25


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; choose one of "
                         f"{', '.join(map(repr, CONVENTIONS))} (see reference_impl.hybrid.data_parallel)")


def is_tp_distributed(module: nn.Module, parameter: nn.Parameter) -> bool:
    """Whether ``parameter`` (owned directly by ``module``) belongs to a module distributed over
    the TP group: it is sharded (``tp_dim``) or a sibling of a sharded parameter."""
    if getattr(parameter, "tp_dim", None) is not None:
        return True
    return any(getattr(p, "tp_dim", None) is not None for p in module.parameters(recurse=False))


def gradient_plan(module: nn.Module | Iterable[nn.Module],
                  convention: str = "megatron") -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Which group each parameter's gradient is all-reduced over: ``{"RDP": [...], "DP": [...]}``
    of (name, parameter), in a deterministic order (the same on every rank of a group)."""
    _check_convention(convention)
    modules = [module] if isinstance(module, nn.Module) else list(module)
    plan: dict[str, list[tuple[str, nn.Parameter]]] = {"RDP": [], "DP": []}
    seen: set[int] = set()
    for index, root in enumerate(modules):
        prefix = "" if len(modules) == 1 else f"{index}."
        for module_name, owner in root.named_modules():
            for name, parameter in owner.named_parameters(recurse=False):
                if id(parameter) in seen or not parameter.requires_grad:
                    continue
                seen.add(id(parameter))
                full_name = prefix + (f"{module_name}.{name}" if module_name else name)
                # BEGIN SOLUTION lab5: gradient_plan (hint: "which group, what divisor" in the notebook)
                if convention == "megatron" or is_tp_distributed(owner, parameter):
                    plan["RDP"].append((full_name, parameter))
                else:
                    plan["DP"].append((full_name, parameter))
                # END SOLUTION
    return plan


def data_shards(groups, convention: str = "megatron") -> int:
    """The number of distinct data shards the global batch is split into (per stage): the
    divisor that turns summed gradients into the global batch's mean-loss gradient."""
    _check_convention(convention)
    # BEGIN SOLUTION lab5: data_shards (hint: "which group, what divisor" in the notebook)
    kind = "DP" if convention == "sagemaker" else "RDP"
    return dist.get_world_size(groups.of_kind(kind))
    # END SOLUTION


def make_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int | None) -> list[list[int]]:
    """Indices of ``tensors`` grouped in order into buckets of at most ``bucket_bytes`` (one
    tensor per bucket when None or 0; a tensor larger than a bucket gets its own; a bucket
    holds one dtype and device)."""
    buckets: list[list[int]] = []
    size = 0
    for index, tensor in enumerate(tensors):
        nbytes = tensor.numel() * tensor.element_size()
        current = buckets[-1] if buckets else None
        fits = (bucket_bytes and current is not None and size + nbytes <= bucket_bytes
                and tensors[current[0]].dtype == tensor.dtype
                and tensors[current[0]].device == tensor.device)
        if fits:
            current.append(index)
            size += nbytes
        else:
            buckets.append([index])
            size = nbytes
    return buckets


def all_reduce_mean(tensors: Sequence[torch.Tensor], group, divisor: int,
                    bucket_bytes: int | None = DEFAULT_BUCKET_BYTES) -> int:
    """Sum ``tensors`` in place over ``group`` and divide by ``divisor``, one all-reduce per
    bucket. Every rank of the group must pass tensors of the same shapes in the same order.
    Returns the number of all-reduces run (0 for a group of one rank)."""
    if not tensors:
        return 0
    single = dist.get_world_size(group) == 1
    count = 0
    for bucket in make_buckets(tensors, bucket_bytes):
        members = [tensors[i] for i in bucket]
        flat = torch.cat([t.reshape(-1) for t in members]) if len(members) > 1 else \
            members[0].reshape(-1).clone()
        if not single:
            dist.all_reduce(flat, group=group)
            count += 1
        flat /= divisor
        offset = 0
        for tensor in members:
            tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
    return count


@dataclass
class SyncReport:
    """What one :func:`sync_gradients` did: parameter names per group kind, the divisor, and
    the number of all-reduces per group kind."""

    convention: str
    divisor: int
    names: dict[str, list[str]] = field(default_factory=dict)
    all_reduces: dict[str, int] = field(default_factory=dict)


def sync_gradients(module: nn.Module | Iterable[nn.Module], groups, convention: str = "megatron",
                   bucket_bytes: int | None = DEFAULT_BUCKET_BYTES) -> SyncReport:
    """All-reduce every parameter's ``.grad`` over the group its distribution needs (see the
    module docstring) and average, so that it becomes the gradient of the global batch's mean
    loss. ``groups`` is ``process_groups.ParallelGroups``. Call on every rank after the
    backward (a missing gradient is taken as zeros, so every rank's buckets line up)."""
    plan = gradient_plan(module, convention)
    divisor = data_shards(groups, convention)
    report = SyncReport(convention, divisor)
    for kind, named in plan.items():
        grads = []
        for _, parameter in named:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            grads.append(parameter.grad)
        report.names[kind] = [name for name, _ in named]
        report.all_reduces[kind] = all_reduce_mean(grads, groups.of_kind(kind), divisor,
                                                   bucket_bytes)
    return report


class GradientSync:
    """``sync_gradients`` bound to a module, its groups and a convention:

        sync = GradientSync(model, groups, convention="megatron")
        loss.backward(); sync(); optimizer.step()
    """

    def __init__(self, module, groups, convention: str = "megatron",
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES):
        _check_convention(convention)
        self.module, self.groups = module, groups
        self.convention, self.bucket_bytes = convention, bucket_bytes

    def __call__(self) -> SyncReport:
        return sync_gradients(self.module, self.groups, self.convention, self.bucket_bytes)
