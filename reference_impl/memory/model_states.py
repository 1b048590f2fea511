"""Model-state memory: the bytes that parameters, gradients and optimizer states take on each
rank, per parameter, under plain data parallelism (stage 0) and the three ZeRO stages.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", section 3: each stage shards one more kind of state over the N data-parallel ranks
(stage 1 the optimizer states, stage 2 the gradients too, stage 3 the parameters too), so a
rank keeps 1/N of it. :func:`zero_memory_formula` counts the bytes, in mixed precision (the
paper's) or in fp32 (what runs here). ``hybrid/zero.py`` runs the stages and measures what a
rank holds (``model_state_bytes``); the planner and the benchmarks count with this formula.
"""
from __future__ import annotations

STAGES = (1, 2, 3)  # the ZeRO stages; 0 is plain data parallelism

# bytes per parameter: (parameter, gradient, optimizer states)
BYTES_PER_PARAMETER = {True: (2, 2, 12), False: (4, 4, 8)}


def zero_memory_formula(num_params: int, world_size: int, stage: int,
                        mixed_precision: bool = True, padded_num_params: int | None = None):
    """Model-state bytes per rank under ZeRO ``stage`` (0: plain data parallelism) on N ranks.

    Per parameter (Rajbhandari et al. 2020, section 3):

    * mixed precision (fp16 parameter and gradient, fp32 master copy, m and v: 2 + 2 + 12 =
      16 bytes): stage 0: 16, ZeRO-1: 4 + 12/N, ZeRO-2: 2 + 14/N, ZeRO-3: 16/N;
    * fp32, what runs on the CPU here (4 param + 4 grad + 8 for Adam's m and v: the fp32
      parameter is its own master, 16 bytes): stage 0: 16, ZeRO-1: 8 + 8/N, ZeRO-2: 4 + 12/N,
      ZeRO-3: 16/N.

    The replicated part counts ``num_params``; the sharded part counts ``padded_num_params``
    / N (default ``num_params``): pass ``hybrid.zero.padded_numel`` to match a measurement
    exactly.
    An int when the division is exact, else a float.
    """
    if stage not in (0, *STAGES):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    param, grad, optimizer = BYTES_PER_PARAMETER[bool(mixed_precision)]
    sharded_kinds = (0, optimizer, grad + optimizer, param + grad + optimizer)[stage]
    replicated = param + grad + optimizer - sharded_kinds
    padded = num_params if padded_num_params is None else padded_num_params
    sharded_bytes = sharded_kinds * padded
    if sharded_bytes % world_size == 0:
        return replicated * num_params + sharded_bytes // world_size
    return replicated * num_params + sharded_bytes / world_size
