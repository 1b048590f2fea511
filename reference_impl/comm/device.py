"""Where a rank computes: its GPU under NCCL, else the CPU; and which backend a launch uses.

    from reference_impl.comm.device import current_device, wait_for_device
    x = torch.randn(4, device=current_device())

``current_device()`` is the device every rank computes on; ``resolve_backend`` chooses NCCL
when there is a GPU for every rank and gloo otherwise (:mod:`reference_impl.comm.launcher`
starts the ranks with it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(backend: str, world_size: int) -> str:
    """``auto`` is NCCL when there is a GPU for every rank, gloo on the CPU otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"backend nccl needs one GPU per rank: {world_size} ranks but {gpus} GPUs")
    return backend


def current_device() -> torch.device:
    """The device this rank computes on: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def wait_for_device() -> None:
    """Wait until this rank's GPU has finished its queued work (nothing to wait for on a CPU):
    call before reading a clock."""
    if current_device().type == "cuda":
        torch.cuda.synchronize()
