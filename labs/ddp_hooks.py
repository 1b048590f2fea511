# Student file for the labs, generated from reference_impl/hybrid/ddp_hooks.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Data parallelism whose all-reduces overlap the backward: hooks, async handles, buckets.

``data_parallel.sync_gradients`` all-reduces after the whole backward, so all its communication
is exposed. :class:`OverlappingDataParallel` does what PyTorch's ``DistributedDataParallel``
does (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", section 3.2): a ``register_post_accumulate_grad_hook`` per parameter; gradients
grouped, in the order the backward produces them, into buckets of about ``bucket_bytes``; one
async all-reduce per bucket, launched when its last gradient is ready; every handle waited and
the sums averaged in :meth:`~OverlappingDataParallel.finish_gradient_sync`, before the step;
``no_sync()`` for gradient accumulation. The group is the data-parallel group (the RDP group
under TP x DP), not necessarily the world.

The mechanics: lab 5's notebook, "5. Data parallelism that overlaps the backward"; use and
limits: ``docs/library.md``, "Hybrid and 3D parallelism".
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from data_parallel import make_buckets


@dataclass
class Bucket:
    """Parameters whose gradients travel in one all-reduce, in the order of the backward."""

    params: list[nn.Parameter]
    names: list[str]
    ready: int = 0  # how many of ``params`` have this backward's gradient
    flat: torch.Tensor | None = None  # the flattened gradients, being all-reduced
    handle: object = None  # the async all-reduce's handle, until it is waited


class OverlappingDataParallel(nn.Module):
    """Wrap ``module`` for data parallelism over ``group`` (default: every rank), with the
    gradient all-reduces launched from backward hooks as buckets fill.

    ``bucket_bytes``: the most bytes of gradient per all-reduce (0: one all-reduce per
    parameter; a parameter larger than a bucket gets a bucket of its own). Build it on every
    rank of ``group`` from the same module (the same initial weights)."""

    def __init__(self, module: nn.Module, group=None, bucket_bytes: int = 25 * 2**20):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("OverlappingDataParallel needs an initialised process group (run "
                               "it inside reference_impl.comm.launcher.launch or under torchrun)")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 0:
            raise ValueError(f"bucket_bytes must be an integer >= 0 (0: one all-reduce per "
                             f"parameter), got {bucket_bytes!r}")
        self.module, self.group, self.bucket_bytes = module, group, bucket_bytes
        self.world_size = dist.get_world_size(group)
        self.require_sync = True  # False inside no_sync()
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        named.reverse()  # the backward produces the last layer's gradients first
        tensors = [p for _, p in named]
        self.buckets = [Bucket([tensors[i] for i in indices], [named[i][0] for i in indices])
                        for indices in make_buckets(tensors, bucket_bytes)]
        self._bucket_of = {p: bucket for bucket in self.buckets for p in bucket.params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._gradient_ready)
                       for p in tensors]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate into ``.grad`` with no communication."""
        raise NotImplementedError('lab5: no_sync (hint: "finishing, and no_sync" in the notebook)')

    def _gradient_ready(self, param: nn.Parameter) -> None:
        """Post-accumulate-grad hook: ``param.grad`` is final for this backward."""
        raise NotImplementedError('lab5: _gradient_ready (hint: "the hook and the launch" in the notebook)')

    def _launch(self, bucket: Bucket) -> None:
        """Start ``bucket``'s all-reduce without waiting for it."""
        raise NotImplementedError('lab5: _launch (hint: "the hook and the launch" in the notebook)')

    def finish_gradient_sync(self) -> None:
        """Wait for every bucket's all-reduce and write the averaged gradients back into
        ``.grad``. Call after the backward and before ``optimizer.step()`` (not needed after a
        backward under ``no_sync``)."""
        missing = [name for bucket in self.buckets if bucket.ready < len(bucket.params)
                   for name, p in zip(bucket.names, bucket.params) if p.grad is None]
        if missing:
            raise RuntimeError(f"{len(missing)} parameter(s) got no gradient in this backward "
                               f"({', '.join(missing[:5])}): OverlappingDataParallel needs every "
                               "parameter that requires a gradient to get one")
        for bucket in self.buckets:
            if bucket.handle is None:  # not launched in the backward (called after a backward
                self._launch(bucket)  # under no_sync): the gradients are ready, send them now
            raise NotImplementedError('lab5: finish_gradient_sync (hint: "finishing, and no_sync" in the notebook)')

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
