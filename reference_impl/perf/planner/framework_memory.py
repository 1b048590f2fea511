"""Model-state bytes per GPU and data-parallel traffic, as each framework allocates and moves them.

``accounting`` selects whose bookkeeping: ``zero`` (Rajbhandari et al. 2020, section 3),
``deepspeed`` (the paper plus DeepSpeed's default buffers), ``megatron`` (18 bytes per
parameter; the distributed optimizer is ZeRO-1) or ``fsdp`` (FSDP2 with torchtitan's mixed
precision, plus the unsharded working set, :func:`fsdp_unsharded_bytes`). The table of bytes and
traffic: docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.memory.model_states import zero_memory_formula

ACCOUNTINGS = ("zero", "deepspeed", "megatron", "fsdp")
STAGES = {"zero": (0, 1, 2, 3), "deepspeed": (0, 1, 2, 3), "megatron": (0, 1), "fsdp": (2, 3)}
DEEPSPEED_BUCKETS_BYTES = 2 * 5e8 * 2   # reduce_bucket_size + allgather_bucket_size, bf16
DEEPSPEED_LIVE_PARAMETER_BYTES = 1e9 * 2  # stage3_max_live_parameters, bf16


def check_accounting(accounting: str, zero: int) -> None:
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {', '.join(ACCOUNTINGS)}, got {accounting!r}")
    if zero not in STAGES[accounting]:
        raise ValueError(f"{accounting} accounting has ZeRO stages {STAGES[accounting]}, not "
                         f"{zero}" + (" (Megatron-LM's distributed optimizer is ZeRO-1)"
                                      if accounting == "megatron" else ""))


def fsdp_sharded_bytes(params: float, shards: int) -> float:
    """FSDP2's sharded states: fp32 parameter, fp32 gradient and Adam's m and v, 16 bytes
    per parameter over the ``shards`` ranks (FSDP2 keeps the sharded parameter in fp32 under
    bf16 mixed precision: PyTorch's ``fully_shard`` docs, MixedPrecisionPolicy)."""
    return 16 * params / shards


def fsdp_unsharded_bytes(layer_params: float, root_params: float = 0.0) -> float:
    """FSDP2's unsharded working set at the peak, beside the sharded states:

    * two layers' bf16 parameters gathered, the one computing and the next, prefetched
      (FSDP2 issues the next all-gather before the current layer's compute: PyTorch's
      ``fully_shard`` docs, implicit prefetching), 2 x 2 bytes per parameter;
    * one layer's unsharded gradient in bf16 and the fp32 copy that is reduce-scattered
      (reduce_dtype float32), 2 + 4 bytes;
    * the root group's bf16 parameters (torchtitan wraps the embedding, the final norm and the
      LM head in the root ``fully_shard``, which FSDP2 does not reshard after forward), 2
      bytes per ``root_params`` for the whole step."""
    return (2 * 2 + 2 + 4) * layer_params + 2 * root_params


def model_state_bytes(params: float, shards: int, zero: int, accounting: str,
                      layer_params: float = 0.0, root_params: float = 0.0) -> float:
    """Bytes of parameters, gradients and optimizer states one GPU holds (docs/library.md);
    ``layer_params``: one layer's parameters on this GPU and ``root_params`` the embedding's,
    the LM head's and the final norm's (FSDP's unsharded working set)."""
    check_accounting(accounting, zero)
    if accounting == "zero":
        return zero_memory_formula(params, shards, zero)
    if accounting == "deepspeed":
        extra = {2: DEEPSPEED_BUCKETS_BYTES, 3: DEEPSPEED_LIVE_PARAMETER_BYTES}.get(zero, 0.0)
        return zero_memory_formula(params, shards, zero) + extra
    if accounting == "megatron":
        return 18 * params if zero == 0 else 6 * params + 12 * params / shards
    if zero == 3:  # fsdp
        return fsdp_sharded_bytes(params, shards) + fsdp_unsharded_bytes(layer_params,
                                                                         root_params)
    return 4 * params + fsdp_sharded_bytes(params, shards)


@dataclass(frozen=True)
class GradientTraffic:
    """Bytes one GPU sends in ring collectives over the d sharding ranks, by when they happen:
    ``reduce`` (gradients) and ``gather`` (parameters) once per step, or per micro-step."""
    reduce_per_step: float = 0.0
    reduce_is_all_reduce: bool = False
    gather_per_step: float = 0.0
    per_microstep: float = 0.0   # the collective's payload per micro-step (gathers + reduce)


def gradient_traffic(params: float, zero: int, accounting: str) -> GradientTraffic:
    """The payloads (bytes of the full tensors; the ring moves (d-1)/d of them per rank)."""
    check_accounting(accounting, zero)
    if accounting == "zero":
        if zero == 3:  # reduce-scatter + two all-gathers: 1.5 x an all-reduce (paper, sec. 7)
            return GradientTraffic(per_microstep=0.0, reduce_per_step=2 * params * 1.5,
                                   reduce_is_all_reduce=True)
        return GradientTraffic(reduce_per_step=2 * params, reduce_is_all_reduce=True)
    if accounting == "deepspeed":
        if zero == 3:
            return GradientTraffic(per_microstep=3 * 2 * params)
        if zero == 2:
            return GradientTraffic(per_microstep=2 * params, gather_per_step=2 * params)
        return GradientTraffic(reduce_per_step=2 * params, reduce_is_all_reduce=True)
    if accounting == "megatron":
        if zero == 0:
            return GradientTraffic(reduce_per_step=4 * params, reduce_is_all_reduce=True)
        return GradientTraffic(reduce_per_step=4 * params, gather_per_step=2 * params)
    if zero == 3:  # fsdp: all-gather bf16 forward and backward, reduce-scatter fp32
        return GradientTraffic(per_microstep=2 * 2 * params + 4 * params)
    return GradientTraffic(reduce_per_step=4 * params, gather_per_step=2 * params)
