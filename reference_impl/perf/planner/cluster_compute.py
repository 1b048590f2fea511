"""What a GPU in a training cluster loses against the same GPU running one layer alone: the
end-to-end terms a single-layer benchmark misses, each a named number with its source.

:data:`CLOCK_UNDER_LOAD` (the clock a power-capped GPU holds, an estimate), :data:`NCCL_SM_SHARE`
(the SMs an overlapped collective takes, from the "DeepSeek-V3 Technical Report", section
3.2.2; :func:`overlap_slowdown`) and :data:`MICROSTEP_OVERHEAD_S` (the framework's time per
forward or backward of a model chunk, estimated); :data:`BEST_CASE` turns them off
(``--best-case``). Sources and reasoning: docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

from dataclasses import dataclass

CLOCK_UNDER_LOAD = {"a100": 1.0, "h100": 0.90, "h200": 0.90}
NCCL_SM_SHARE = 20 / 132
MICROSTEP_OVERHEAD_S = {"megatron": 0.2e-3, "zero": 0.2e-3, "fsdp": 0.2e-3, "deepspeed": 0.6e-3}


@dataclass(frozen=True)
class ClusterTerms:
    """The end-to-end terms of one GPU type in a cluster (docs/library.md).
    ``tp_overlap_bound``: price Megatron-Core's tp_comm_overlap at its bound (only what
    outlasts the GEMMs exposed) instead of as the decomposed overlap runs."""
    clock: float = 1.0
    sm_share: float = NCCL_SM_SHARE
    microstep_overhead: bool = True
    tp_overlap_bound: bool = False

    def __post_init__(self):
        if not 0 < self.clock <= 1:
            raise ValueError(f"clock under load must be in (0, 1], got {self.clock}")
        if not 0 <= self.sm_share < 1:
            raise ValueError(f"SM share must be in [0, 1), got {self.sm_share}")

    def overhead_s(self, accounting: str) -> float:
        """Seconds per forward or backward of one model chunk (docs/library.md)."""
        return MICROSTEP_OVERHEAD_S[accounting] if self.microstep_overhead else 0.0

    def overlap_slowdown(self, collective_s: float, window_s: float) -> float:
        """Seconds the compute of ``window_s`` loses to a collective of ``collective_s`` run
        beside it: the collective's SMs, for as long as the two overlap."""
        return self.sm_share * min(collective_s, window_s)


BEST_CASE = ClusterTerms(clock=1.0, sm_share=0.0, microstep_overhead=False,
                         tp_overlap_bound=True)


def terms_of(gpu: str) -> ClusterTerms:
    """The terms of a known GPU type (a100, h100, h200)."""
    return ClusterTerms(clock=CLOCK_UNDER_LOAD[gpu.lower()])
