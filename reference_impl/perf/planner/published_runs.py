"""Published training runs the planner is checked against, each with its source and the FLOP
count that source reports with.

Narayanan et al. 2021 (Table 1), Korthikanti et al. 2022 (Tables 3 and 5), Dubey et al. 2024,
"The Llama 3 Herd of Models" (Table 4), torchtitan's docs/performance.md, and NeMo 24.07's
performance summary (listed, not predicted). Each source's FLOP count and what the planner
assumes: docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from reference_impl.perf.planner.model_spec import PRESETS, ModelSpec

NARAYANAN = "Narayanan et al. 2021, Table 1"
KORTHIKANTI = "Korthikanti et al. 2022, Table 5"
LLAMA3 = "Dubey et al. 2024 (Llama 3), Table 4"
TORCHTITAN = "torchtitan docs/performance.md"
NEMO = "NeMo 24.07 performance summary"


def gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    """The GPT models of Narayanan et al. and Korthikanti et al.: 4h MLP, tied embeddings,
    vocabulary 51200, sequence 2048, dropout."""
    return ModelSpec(name, layers, hidden, heads, 51200, 2048, tied_embeddings=True,
                     dropout=True)


def narayanan_flops(model: ModelSpec, batch: int) -> float:
    s, layers, h, v = model.seq_len, model.layers, model.hidden, model.vocab
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def korthikanti_flops(model: ModelSpec, batch: int) -> float:
    s, layers, h, v = model.seq_len, model.layers, model.hidden, model.vocab
    return 72 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))


def six_n_flops(model: ModelSpec, batch: int) -> float:
    return model.model_flops_per_token() * batch * model.seq_len


@dataclass(frozen=True)
class PublishedRun:
    """One published configuration and its reported throughput. ``micro_batch`` or ``v`` None:
    not published, the planner chooses. ``metric``: "tflops" (per GPU) or "mfu"."""
    name: str
    source: str
    model: ModelSpec
    gpu: str
    gpus: int
    tp: int
    pp: int
    dp: int
    global_batch: int
    recompute: str | None
    attention: str
    accounting: str
    zero: int
    metric: str
    published: float
    flops: object = six_n_flops            # FLOPs of one iteration, as the source counts
    cp: int = 1
    micro_batch: int | None = None
    v: int | None = None
    sequence_parallel: bool = True
    embedding_in_split: bool = False       # the embedding and loss count as layers (layout.py)
    not_predicted: str = ""                # the feature the planner lacks, when it does
    notes: tuple[str, ...] = field(default=())


def _narayanan(size, layers, hidden, heads, tp, pp, gpus, batch, tflops):
    return PublishedRun(f"GPT {size}", NARAYANAN, gpt(f"gpt-{size}", layers, hidden, heads),
                        "a100", gpus, tp, pp, gpus // (tp * pp), batch, "full", "explicit",
                        "megatron", 0, "tflops", tflops, narayanan_flops,
                        sequence_parallel=False)


def _korthikanti(size, layers, hidden, heads, pp, gpus, batch, mfu):
    return PublishedRun(f"GPT {size} SP+sel.", KORTHIKANTI, gpt(f"gpt-{size}", layers, hidden,
                                                                heads),
                        "a100", gpus, 8, pp, gpus // (8 * pp), batch, "selective", "explicit",
                        "megatron", 0, "mfu", mfu, korthikanti_flops)


LLAMA2_70B = ModelSpec("llama2-70b", 80, 8192, 64, 32000, 4096, kv_heads=8, ffn_hidden=28672,
                       gated_mlp=True)
LLAMA3_70B_8K = ModelSpec("llama3-70b", 80, 8192, 64, 128256, 8192, kv_heads=8,
                          ffn_hidden=28672, gated_mlp=True)
LLAMA3_405B = PRESETS["405b"]
LLAMA3_405B_128K = ModelSpec("405b-128k", 126, 16384, 128, 128256, 131072, kv_heads=8,
                             ffn_hidden=53248, gated_mlp=True)

PUBLISHED_RUNS = [
    # Narayanan et al. 2021, Table 1: size, layers, hidden, heads, tp, pp, GPUs, batch, TFLOP/s
    _narayanan("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    _narayanan("3.6B", 30, 3072, 32, 2, 1, 64, 512, 138),
    _narayanan("7.5B", 36, 4096, 32, 4, 1, 128, 512, 142),
    _narayanan("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135),
    _narayanan("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138),
    _narayanan("76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140),
    _narayanan("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148),
    _narayanan("310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155),
    _narayanan("529.6B", 105, 20480, 128, 8, 35, 2520, 2520, 163),
    _narayanan("1008.0B", 128, 25600, 160, 8, 64, 3072, 3072, 163),
    # Korthikanti et al. 2022, Tables 3 and 5 ("present work"): size, layers, hidden, heads,
    # pp (tp 8), GPUs, batch, MFU
    _korthikanti("22B", 48, 6144, 64, 1, 8, 4, 0.415),
    _korthikanti("175B", 96, 12288, 96, 8, 64, 64, 0.514),
    _korthikanti("530B", 105, 20480, 128, 35, 280, 280, 0.560),
    _korthikanti("1T", 128, 25600, 160, 64, 512, 512, 0.563),
    # Llama 3, Table 4: 16M tokens per batch, no activation checkpointing, FSDP (ZeRO-2-like)
    PublishedRun("Llama 3 405B, 8K GPUs", LLAMA3, LLAMA3_405B, "h100", 8192, 8, 16, 64, 2048,
                 None, "flash", "fsdp", 2, "tflops", 430, micro_batch=1, v=8, embedding_in_split=True),
    PublishedRun("Llama 3 405B, 16K GPUs", LLAMA3, LLAMA3_405B, "h100", 16384, 8, 16, 128,
                 2048, None, "flash", "fsdp", 2, "tflops", 400, micro_batch=1,
                 v=8, embedding_in_split=True),
    PublishedRun("Llama 3 405B, 16K GPUs, 128K", LLAMA3, LLAMA3_405B_128K, "h100", 16384, 8,
                 16, 8, 128, None, "flash", "fsdp", 2, "tflops", 380, cp=16, micro_batch=1,
                 v=8, embedding_in_split=True,
                 not_predicted="the paper's FLOP count at 128K is not given, and the attention "
                               "term decides it (12Lhs is 1.3x 6N there): not scored"),
    # torchtitan, 64 A100 80GB, FSDP2 (ZeRO-3), local batch per GPU, full activation checkpointing
    PublishedRun("Llama 3 70B, FSDP, 64 A100", TORCHTITAN, LLAMA3_70B_8K, "a100", 64, 1, 1, 64,
                 64, "full", "flash", "fsdp", 3, "mfu", 0.517, micro_batch=1),
    PublishedRun("Llama 2 70B, FSDP, 64 A100", TORCHTITAN, LLAMA2_70B, "a100", 64, 1, 1, 64,
                 128, "full", "flash", "fsdp", 3, "mfu", 0.505, micro_batch=2),
    # NeMo 24.07 on DGX-H100, FP8
    PublishedRun("NeMo Llama 2 70B TP4 PP4 VP20", NEMO, LLAMA2_70B, "h100", 64, 4, 4, 4, 128,
                 None, "flash", "megatron", 1, "tflops", 759, micro_batch=1, v=20,
                 not_predicted="FP8: the planner has no FP8 calibration table"),
    PublishedRun("NeMo Llama 3 70B TP4 PP4 CP2 VP5", NEMO, LLAMA3_70B_8K, "h100", 64, 4, 4, 2,
                 128, None, "flash", "megatron", 1, "tflops", 738, cp=2, micro_batch=1, v=5,
                 not_predicted="FP8: the planner has no FP8 calibration table"),
]
