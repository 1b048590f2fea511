"""What a run composes, checked once: the layout's sizes (``comm.parallel_dims``) and the
training choices (sequence parallelism, recomputation, the data-parallel kind, the schedule,
the precision, buckets), and every rule of what cannot compose, each in one function, refused
with the rule and the numbers. The process that starts a run checks the plan against the model
(:meth:`TrainingPlan.check`); the ranks get the checked plan and trust it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from reference_impl.comm.parallel_dims import ParallelDims, check_expert_split
from reference_impl.cp.load_balance import check_sequence
from reference_impl.hybrid.data_parallel import DEFAULT_BUCKET_BYTES
from reference_impl.hybrid.dp_kinds.kind import DataParallelKind
from reference_impl.hybrid.dp_kinds.registry import kind_of
from reference_impl.memory.recompute import MODES
from reference_impl.model import ModelConfig
from reference_impl.pipeline.named_schedules import build_schedule
from reference_impl.pipeline.pipeline_schedules import Schedule
from reference_impl.model.precision import check_precision
from reference_impl.tp.tp_splits import check_block_split

RECOMPUTE_MODES = ("none", *(mode for mode in MODES if mode))


@dataclass(frozen=True)
class TrainingPlan:
    """The sizes and choices of a run; what cannot work alone is refused when it is made."""

    dp: int = 1  # model replicas (RDP_GROUP size)
    tp: int = 1
    pp: int = 1
    cp: int = 1  # context parallelism: ranks sharing each sequence (CP_GROUP size)
    ep: int = 1  # expert parallelism: ranks of a replica group sharing each MoE block's experts
    order: str = "megatron"  # the rank order (comm.groups.ORDERS)
    sp: bool = False  # sequence parallelism inside the TP group
    recompute: str = "none"  # none | selective | full
    dp_kind: str = "sync"  # a name in dp_kinds.registry.KINDS
    schedule: str | Schedule = "1f1b"
    microbatches: int | None = None  # per replica and step (default: pp)
    chunks: int = 1  # model chunks per rank (interleaved)
    vocab_parallel: bool = True
    precision: str = "fp32"
    bucket_bytes: int | None = DEFAULT_BUCKET_BYTES
    dims: ParallelDims = field(init=False, repr=False)  # the sizes and order, checked
    kind: DataParallelKind = field(init=False, repr=False, compare=False)  # dp_kind's strategy
    checked: tuple = field(default=(), init=False, compare=False, repr=False)

    def __post_init__(self):
        if isinstance(self.schedule, Schedule):  # a schedule made already says m and v
            object.__setattr__(self, "microbatches", self.schedule.microbatches)
            object.__setattr__(self, "chunks", self.schedule.chunks)
        elif self.microbatches is None:
            object.__setattr__(self, "microbatches", self.pp)
        for name in ("microbatches", "chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        object.__setattr__(self, "dims", ParallelDims(self.dp, self.tp, self.pp, self.cp,
                                                      self.ep, self.order))
        object.__setattr__(self, "kind", kind_of(self.dp_kind))
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got "
                             f"{self.recompute!r}")
        check_precision(self.precision)
        if self.sp and self.tp == 1:
            raise ValueError("sequence parallelism needs tp > 1 (got tp = 1): it splits the "
                             "sequence over the tensor-parallel group")
        self.kind.check_schedule(self.build_schedule())

    @property
    def world_size(self) -> int:
        return self.dims.world_size

    def build_schedule(self) -> Schedule:
        if isinstance(self.schedule, Schedule):
            if self.schedule.ranks != self.pp:
                raise ValueError(f"the schedule is for {self.schedule.ranks} ranks but pp = "
                                 f"{self.pp}")
            return self.schedule
        return build_schedule(self.schedule, self.pp, self.microbatches, self.chunks)

    def check(self, config: ModelConfig, batch: int | None = None, experts: int = 0,
              optimizer=None) -> None:
        """Refuse a model (its shape, its ``experts``), global ``batch`` or ``optimizer`` this
        plan cannot run; the model's rules run once per model (the plan remembers it)."""
        if (config, experts) not in self.checked:
            check_tensor_parallel(config, self.tp)
            if self.recompute == "selective" and config.grouped_query_attention:
                raise ValueError("recompute selective re-implements the GPT attention's "
                                 "forward (memory/recompute.py); grouped-query attention (rotary "
                                 "positions or kv_heads < heads) takes recompute none or full")
            check_sequence_parallel(config, self.tp, self.cp, self.sp)
            check_context_parallel(config, self.cp)
            check_stages(config, self.pp, self.chunks)
            check_experts(experts, self)
            object.__setattr__(self, "checked", (*self.checked, (config, experts)))
        if batch is not None and batch % (self.dp * self.microbatches):
            raise ValueError(f"the global batch of {batch} samples is not divisible by dp x "
                             f"microbatches = {self.dp} x {self.microbatches}: every replica "
                             f"cuts its slice into micro-batches of equal size")
        if optimizer is not None:
            self.kind.check_optimizer(optimizer)


def check_tensor_parallel(config: ModelConfig, tp: int) -> None:
    """tp splits the heads (KV heads split or replicated), the hidden size and the MLP."""
    check_block_split(config.heads, config.kv_heads or config.heads, config.hidden,
                      config.ffn_size, tp)


def check_sequence_parallel(config: ModelConfig, tp: int, cp: int, sp: bool) -> None:
    """Sequence parallelism splits each CP rank's seq_len / cp positions over TP."""
    if sp and (config.seq_len // cp) % tp:
        shard = f"seq_len {config.seq_len}" + (f" / cp {cp} = {config.seq_len // cp} tokens "
                                               f"per CP rank" if cp > 1 else "")
        raise ValueError(f"{shard} {'are' if cp > 1 else 'is'} not divisible by tp = {tp}: "
                         f"sequence parallelism splits them over the tensor-parallel group")


def check_context_parallel(config: ModelConfig, cp: int) -> None:
    """A CP rank holds two chunks from different places of each sequence: their positions come
    from rotary attention, and the sequence splits in 2 cp chunks."""
    if cp == 1:
        return
    if config.positions != "rotary":
        raise ValueError(f"context parallelism (cp = {cp}) needs rotary positions (model."
                         f"llama_config, or ModelConfig positions='rotary'), got positions "
                         f"{config.positions!r}: a CP rank holds two chunks from different "
                         f"places of the sequence, and only the rotary attention is given "
                         f"their global positions, not the learned position embedding")
    check_sequence(config.seq_len, cp)


def check_stages(config: ModelConfig, pp: int, chunks: int) -> None:
    stages = pp * chunks
    if config.layers + 2 < stages:
        raise ValueError(f"{config.layers} blocks + embedding + head = {config.layers + 2} "
                         f"layers cannot fill pp x chunks = {pp} x {chunks} = {stages} "
                         f"pipeline stages")


def check_experts(experts: int, plan: TrainingPlan) -> None:
    """What composes with a mixture of ``experts`` (0: a dense model)."""
    check_expert_split(experts, plan.ep, plan.dp)
    if not experts:
        return
    for name, size in (("tp", plan.tp), ("cp", plan.cp)):
        if size > 1:
            raise ValueError(f"experts with {name} = {size}: the kit's MoE blocks are neither "
                             f"tensor- nor context-parallel; use {name} = 1 (experts compose "
                             f"with dp, ep and pp)")
    if plan.ep == 1:
        return
    if plan.dp_kind != "sync":
        raise ValueError(f"ep = {plan.ep} with dp_kind {plan.dp_kind}: the ranks of an EP "
                         f"group hold different experts, which only dp_kind sync reduces apart "
                         f"from the dense parameters; use dp_kind sync")
    if plan.recompute != "none":
        raise ValueError(f"ep = {plan.ep} with recompute {plan.recompute}: recomputing a block "
                         f"would run its all-to-alls again in the backward; use recompute none")
