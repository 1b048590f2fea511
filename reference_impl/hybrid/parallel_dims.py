"""What to compose: the dimensions of a parallel run (dp, tp, pp, cp, sequence parallelism,
recomputation, the data-parallel kind, the schedule, the precision), and the combinations that
cannot work, refused with the rule and the numbers when they are made or meet a model
(:meth:`ParallelDims.check_model`). ``parallelize.py`` applies them.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.hybrid.context_parallel import check_context_parallel
from reference_impl.hybrid.data_parallel import DEFAULT_BUCKET_BYTES
from reference_impl.hybrid.dp_kinds.registry import kind_of
from reference_impl.model import ModelConfig
from reference_impl.pipeline.named_schedules import build_schedule
from reference_impl.pipeline.pipeline_schedules import Schedule
from reference_impl.precision import check_precision
from reference_impl.tp.llama_tp import check_tensor_parallel

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class ParallelDims:
    """What to compose; the combinations that cannot work are refused when it is made."""

    dp: int = 1  # model replicas (RDP_GROUP size)
    tp: int = 1
    pp: int = 1
    cp: int = 1  # context parallelism: ranks sharing each sequence (CP_GROUP size)
    ep: int = 1  # expert parallelism: ranks of a replica group sharing each MoE block's experts
    sp: bool = False  # sequence parallelism inside the TP group
    recompute: str = "none"  # none | selective | full
    dp_kind: str = "sync"  # a name in dp_kinds.registry.KINDS
    schedule: str | Schedule = "1f1b"
    microbatches: int | None = None  # per replica and step (default: pp)
    chunks: int = 1  # model chunks per rank (interleaved)
    vocab_parallel: bool = True
    precision: str = "fp32"
    bucket_bytes: int | None = DEFAULT_BUCKET_BYTES

    def __post_init__(self):
        if isinstance(self.schedule, Schedule):  # a schedule made already says m and v
            object.__setattr__(self, "microbatches", self.schedule.microbatches)
            object.__setattr__(self, "chunks", self.schedule.chunks)
        elif self.microbatches is None:
            object.__setattr__(self, "microbatches", self.pp)
        for name in ("dp", "tp", "pp", "cp", "ep", "microbatches", "chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got "
                             f"{self.recompute!r}")
        check_precision(self.precision)
        if self.sp and self.tp == 1:
            raise ValueError("sequence parallelism needs tp > 1 (got tp = 1): it splits the "
                             "sequence over the tensor-parallel group")
        kind_of(self.dp_kind).check_schedule(self.build_schedule())

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    def build_schedule(self) -> Schedule:
        if isinstance(self.schedule, Schedule):
            if self.schedule.ranks != self.pp:
                raise ValueError(f"the schedule is for {self.schedule.ranks} ranks but pp = "
                                 f"{self.pp}")
            return self.schedule
        return build_schedule(self.schedule, self.pp, self.microbatches, self.chunks)

    def check_model(self, config: ModelConfig, batch: int | None = None) -> None:
        """Refuse a model shape (and global batch) these dimensions cannot split."""
        for what, size in (("heads", config.heads), ("hidden size", config.hidden)):
            if size % self.tp:
                raise ValueError(f"{what} {size} is not divisible by tp = {self.tp}")
        check_tensor_parallel(config, self.tp)  # KV heads split or replicated, the MLP's size
        if self.recompute == "selective" and config.grouped_query_attention:
            raise ValueError("recompute selective re-implements the GPT attention's forward "
                             "(memory/recompute.py); grouped-query attention (rotary positions "
                             "or kv_heads < heads) takes recompute none or full")
        if self.sp and config.seq_len % self.tp:
            raise ValueError(f"seq_len {config.seq_len} is not divisible by tp = {self.tp}: "
                             f"sequence parallelism gives each TP rank seq_len / tp positions")
        check_context_parallel(config, self.cp, self.tp, self.sp)
        stages = self.pp * self.chunks
        if config.layers + 2 < stages:
            raise ValueError(f"{config.layers} blocks + embedding + head = {config.layers + 2} "
                             f"layers cannot fill pp x chunks = {self.pp} x {self.chunks} = "
                             f"{stages} pipeline stages")
        if batch is not None and batch % (self.dp * self.microbatches):
            raise ValueError(f"the global batch of {batch} samples is not divisible by dp x "
                             f"microbatches = {self.dp} x {self.microbatches}: every replica "
                             f"cuts its slice into micro-batches of equal size")
