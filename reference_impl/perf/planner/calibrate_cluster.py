"""Measure on one machine what it can show of the cluster terms (``cluster_compute.py``): the
SMs an overlapped all-reduce takes from a layer, and the SM clock under load (NVML, ``pynvml``).

    torchrun --nproc-per-node 8 -m reference_impl.perf.planner calibrate --cluster-terms
    python -m reference_impl.perf.planner calibrate --cluster-terms --dry-run   # CPU, gloo

Alone in its process it makes a group of one, whose numbers only show that the measurement
runs. How: docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from reference_impl.perf.planner.layer_efficiency import CALIBRATION_SHAPES
from reference_impl.perf.planner.layer_workload import TINY, layer_step
from reference_impl.perf.step_timing import mean_seconds

BUCKET_ELEMENTS = 40_000_000   # Megatron-LM's smallest gradient bucket, fp32 (dp_collectives)
DRY_RUN_ELEMENTS = 1 << 16
LOAD_STEPS = 30


def _group(device: torch.device) -> bool:
    """Join torchrun's group, or make a group of one; True when this call made it."""
    if dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


def clock_fraction(device: torch.device) -> float | None:
    """The SM clock now over the GPU's maximum (NVML), or None where it cannot be read."""
    if device.type != "cuda":
        return None
    try:
        import pynvml
        now = torch.cuda.clock_rate(device)
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        return now / pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # no pynvml, no NVML: the clock is not readable here
        return None


def measure(dry_run: bool = False) -> dict:
    """Times of a layer alone, an all-reduce alone and both together, the SM share the
    all-reduce took, and the clock fraction under load (docs/library.md)."""
    if dry_run:
        device, dtype, steps = torch.device("cpu"), torch.float32, (1, 3)
        shape, seq, elements = TINY, 64, DRY_RUN_ELEMENTS
    else:
        if not torch.cuda.is_available():
            raise SystemExit("--cluster-terms needs a CUDA GPU; --dry-run runs it on the CPU")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dtype, steps = torch.bfloat16, (3, 10)
        shape, seq, elements = CALIBRATION_SHAPES["llama3-70b"], 4096, BUCKET_ELEMENTS
    made = _group(device)
    try:
        layer = layer_step(shape, seq, 1, 1 if dry_run else 8, device, dtype)
        bucket = torch.ones(elements, dtype=torch.float32, device=device)

        def both():
            work = dist.all_reduce(bucket, async_op=True)
            layer()
            work.wait()

        layer_s = mean_seconds(layer, device, *steps)
        comm_s = mean_seconds(lambda: dist.all_reduce(bucket), device, *steps)
        both_s = mean_seconds(both, device, *steps)
        if not dry_run:  # keep the GPU loaded before reading its clock
            mean_seconds(layer, device, 0, LOAD_STEPS)
        clock = clock_fraction(device)
    finally:
        if made:
            dist.destroy_process_group()
    overlapped = min(layer_s, comm_s)
    share = max(0.0, both_s - max(layer_s, comm_s)) / overlapped if overlapped > 0 else 0.0
    return dict(device=str(device), world_size=int(os.environ.get("WORLD_SIZE", 1)),
                layer_s=layer_s, all_reduce_s=comm_s, together_s=both_s, sm_share=share,
                clock_fraction=clock)


def report(result: dict) -> str:
    clock = result["clock_fraction"]
    return "\n".join([
        f"cluster terms on {result['device']} (a group of {result['world_size']}):",
        f"  layer alone {result['layer_s'] * 1e3:.3f} ms, all-reduce alone "
        f"{result['all_reduce_s'] * 1e3:.3f} ms, together {result['together_s'] * 1e3:.3f} ms",
        f"  the all-reduce's share of the GPU while they overlap: {result['sm_share']:.2f} "
        f"(cluster_compute.NCCL_SM_SHARE assumes {20 / 132:.2f})",
        "  clock under load: " + (f"{clock:.2f} of the maximum (cluster_compute."
                                  f"CLOCK_UNDER_LOAD assumes 0.90 on H100s)" if clock else
                                  "not readable here (needs a GPU and pynvml)")])
