"""What a GPU in a training cluster loses against the same GPU running one layer alone: the
end-to-end terms a single-layer benchmark misses, each a named number with its source.

* **Sustained clock** (:data:`CLOCK_UNDER_LOAD`): a layer timed alone for a few seconds runs at
  the clock a cool GPU boosts to; a cluster at full load for hours holds the clock its board
  power allows. The H100 SXM's data-sheet peak (989 TFLOP/s dense bf16) is 132 SMs x 4096
  flops per clock at 1830 MHz; NVIDIA's maximum boost is 1980 MHz, and under sustained dense
  GEMM load within its 700 W the clock settles lower. 0.90 is an estimate, not a measurement
  here: about 1780 MHz held against the 1980 MHz a short benchmark reaches, in the range public
  throttling reports give for power-capped H100 and H200 boards (80-95% of boost).
  ``python -m reference_impl.perf.planner calibrate --cluster-terms`` measures it on a GPU.
  The A100's number is 1: its GEMM ceiling is fitted to end-to-end runs (hardware.py), which
  already ran at the clock their clusters held.
* **SMs taken by overlapped collectives** (:data:`NCCL_SM_SHARE`): an NCCL kernel that runs
  beside a GEMM holds SMs for its whole duration, so the overlapped compute runs on the rest.
  DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", section 3.2.2: 20 of the 132 SMs of an
  H800 drive its InfiniBand and NVLink traffic at full bandwidth; NCCL's ring kernels launch one
  block per channel, 16 to 32 on an 8-GPU H100 node. 20/132 is taken for every overlapped
  collective: the compute beside it slows by that share of the overlapped time
  (:func:`overlap_slowdown`). ``calibrate --cluster-terms`` times a layer with an all-reduce
  beside it.
* **Framework time per micro-step** (:data:`MICROSTEP_OVERHEAD_S`): each forward or backward of
  a model chunk starts after the host has received the previous stage's tensor (a blocking
  send/receive in every framework here), so the first kernels of the chunk are launched while
  the GPU waits. Estimated from the calibration table's launch floor (2.05 ms for a whole eager
  layer, data/h100_layer_efficiency.json): the handful of launches at a chunk's boundary, the
  receive's handshake and the loss and gradient-accumulation bookkeeping, about a tenth of it
  for Megatron-LM's schedule. DeepSpeed's pipeline engine interprets its schedule in Python,
  instruction by instruction, with a blocking send/receive each: estimated three times that.
  FSDP adds a pre-forward and pre-backward hook per wrapped layer, about the same as
  Megatron-LM's schedule per micro-step. These are estimates; the A100 ceiling's fit absorbs
  what they miss on the A100.

:data:`BEST_CASE` turns them all off and prices TP overlap at its bound: the most optimistic
reading of every option (``--best-case``).
"""
from __future__ import annotations

from dataclasses import dataclass

CLOCK_UNDER_LOAD = {"a100": 1.0, "h100": 0.90, "h200": 0.90}
NCCL_SM_SHARE = 20 / 132
MICROSTEP_OVERHEAD_S = {"megatron": 0.2e-3, "zero": 0.2e-3, "fsdp": 0.2e-3, "deepspeed": 0.6e-3}


@dataclass(frozen=True)
class ClusterTerms:
    """The end-to-end terms of one GPU type in a cluster (module docstring).
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
        """Seconds per forward or backward of one model chunk (module docstring)."""
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
