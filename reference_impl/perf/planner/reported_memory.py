"""Reported peak memory of published training runs, each with the counter it is and its source:
what the planner's memory estimate (``memory_estimate``) is checked against (``validation``).

Source: torchtitan's benchmarks/llama3_h100_202412_torchtitan.md (Liang et al. 2024,
"TorchTitan", Tables 1-6), "Memory(GiB)" the caching allocator's reserved peak. The runs, the
counter and what the planner does not model: docs/library.md, 'The planner's model, term by
term'.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from reference_impl.perf.planner.model_spec import PRESETS, ModelSpec
from reference_impl.perf.planner.published_runs import LLAMA3_70B_8K

TORCHTITAN_H100 = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
RESERVED = "max_memory_reserved"   # torch.cuda.memory_stats()["reserved_bytes.all.peak"]

LLAMA31_8B = ModelSpec("llama3.1-8b", 32, 4096, 32, 128256, 8192, kv_heads=8,
                       ffn_hidden=14336, gated_mlp=True)


@dataclass(frozen=True)
class ReportedPeak:
    """One run's layout and its reported peak per GPU (GiB, the maximum over the GPUs)."""
    name: str
    source: str
    model: ModelSpec
    gpu: str                  # a hardware.GPU_VARIANTS key
    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    recompute: str | None
    reported_gib: float
    counter: str = RESERVED
    cp: int = 1
    accounting: str = "fsdp"
    zero: int = 3
    compiled: bool = False
    float8: bool = False
    not_predicted: str = ""


def _titan(name, model, gpus, dp, micro_batch, recompute, gib, tp=1, cp=1, pp=1,
           compiled=False, float8=False, not_predicted=""):
    return ReportedPeak(name, TORCHTITAN_H100, model, "h100-sxm-96gb", gpus, tp, pp, dp,
                        micro_batch, recompute, gib, cp=cp, compiled=compiled, float8=float8,
                        not_predicted=not_predicted)


def _seq(seq: int) -> ModelSpec:
    return replace(LLAMA31_8B, seq_len=seq)


PIPELINE_MICROBATCHES = ("the number of pipeline microbatches per step is not in the table "
                         "(torchtitan's default then was one per stage)")
LOSS_PARALLEL = ("TP's vocabulary-parallel loss runs through DTensor's loss_parallel, whose "
                 "temporaries the planner does not count")

REPORTED_PEAKS = [
    # Table 1: 8 GPUs, FSDP 8, local batch 2, seq 8192, selective (op) activation checkpointing
    _titan("Llama 3.1 8B FSDP", LLAMA31_8B, 8, 8, 2, "selective", 82.4),
    _titan("Llama 3.1 8B FSDP + compile", LLAMA31_8B, 8, 8, 2, "selective", 77.0,
           compiled=True),
    _titan("Llama 3.1 8B FSDP + compile + Float8", LLAMA31_8B, 8, 8, 2, "selective", 76.8,
           compiled=True, float8=True),
    # Table 2: 8 GPUs, local batch 1, full activation checkpointing, torch.compile + Float8
    _titan("Llama 3.1 8B FSDP 8, CP 1, 32K", _seq(32768), 8, 8, 1, "full", 83.9,
           compiled=True, float8=True),
    _titan("Llama 3.1 8B FSDP 4, CP 2, 64K", _seq(65536), 8, 4, 1, "full", 84.2, cp=2,
           compiled=True, float8=True),
    _titan("Llama 3.1 8B FSDP 2, CP 4, 128K", _seq(131072), 8, 2, 1, "full", 84.0, cp=4,
           compiled=True, float8=True),
    _titan("Llama 3.1 8B FSDP 1, CP 8, 256K", _seq(262144), 8, 1, 1, "full", 84.5, cp=8,
           compiled=True, float8=True),
    # Table 3: 128 GPUs, FSDP 128, local batch 2, seq 8192, selective (op)
    _titan("Llama 3.1 8B FSDP, 128 GPUs", LLAMA31_8B, 128, 128, 2, "selective", 67.0),
    _titan("Llama 3.1 8B FSDP + compile, 128 GPUs", LLAMA31_8B, 128, 128, 2, "selective",
           62.0, compiled=True),
    _titan("Llama 3.1 8B FSDP + compile + Float8, 128 GPUs", LLAMA31_8B, 128, 128, 2,
           "selective", 61.8, compiled=True, float8=True),
    # Table 4: 70B, 256 GPUs, FSDP 32 x TP 8, local batch 16, full AC, compile + Float8
    _titan("Llama 3.1 70B FSDP 32 x TP 8", LLAMA3_70B_8K, 256, 32, 16, "full", 71.9, tp=8,
           compiled=True, float8=True, not_predicted=LOSS_PARALLEL),
    _titan("Llama 3.1 70B FSDP 32 x TP 8, async TP", LLAMA3_70B_8K, 256, 32, 16, "full", 67.6,
           tp=8, compiled=True, float8=True, not_predicted=LOSS_PARALLEL),
    # Table 5: 405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, local batch 32, full AC
    _titan("Llama 3.1 405B 3D, 1F1B", PRESETS["405b"], 512, 8, 32, "full", 82.5, tp=8, pp=8,
           compiled=True, float8=True, not_predicted=PIPELINE_MICROBATCHES),
    _titan("Llama 3.1 405B 3D, interleaved 1F1B", PRESETS["405b"], 512, 8, 32, "full", 72.7,
           tp=8, pp=8, compiled=True, float8=True, not_predicted=PIPELINE_MICROBATCHES),
]
