"""A layout evaluated (memory and time), every layout that fits ranked, and the recommendation:
the fastest by the estimate, and the runner-up with a different TP x PP x CP."""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.perf.planner.hardware import GiB, Cluster
from reference_impl.perf.planner.layout import Layout, candidate_layouts, check_layout
from reference_impl.perf.planner.memory_estimate import MemoryEstimate, estimate_memory
from reference_impl.perf.planner.model_spec import ModelSpec, positive
from reference_impl.perf.planner.time_estimate import TimeEstimate, estimate_time


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    cluster: Cluster
    layout: Layout
    global_batch: int
    memory: MemoryEstimate
    time: TimeEstimate

    @property
    def memory_bytes(self) -> float:
        return self.memory.total_bytes

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.cluster.usable_bytes

    @property
    def step_s(self) -> float:
        return self.time.step_s

    @property
    def microbatches(self) -> int:
        return self.time.microbatches

    @property
    def tokens(self) -> int:
        return self.global_batch * self.model.seq_len

    @property
    def tokens_per_gpu_s(self) -> float:
        return self.tokens / self.step_s / self.cluster.num_gpus

    @property
    def model_tflops_per_gpu(self) -> float:
        """(6N + 12 L h s) x tokens / step / GPUs (ModelSpec.model_flops_per_token)."""
        return self.model.model_flops_per_token() * self.tokens_per_gpu_s / 1e12

    @property
    def mfu(self) -> float:
        return self.model_tflops_per_gpu / self.cluster.gpu.peak_tflops

    def key(self) -> tuple:
        """How the model is split: (TP, PP)."""
        return (self.layout.tp, self.layout.pp)

    def row(self) -> str:
        lay = self.layout
        return (f"{lay.tp:>3} {lay.pp:>3} {lay.v:>2} {lay.cp:>3} {lay.dp:>4} {lay.zero:>5} "
                f"{lay.micro_batch:>3} {(lay.recompute or 'none'):>9} "
                f"{self.memory_bytes / GiB:>8.1f} {self.time.bubble:>7.1%} "
                f"{self.step_s:>8.2f} {self.mfu:>6.1%}"
                f"{f'  EP{lay.ep}' if lay.ep > 1 else ''}")


TABLE_HEADER = " tp  pp  v  cp   dp  zero  mb recompute  mem GiB  bubble   step s    MFU"


def evaluate(model: ModelSpec, cluster: Cluster, layout: Layout, global_batch: int) -> Plan:
    """Memory (memory_estimate.py) and step time (time_estimate.py) of ``layout``."""
    check_layout(model, cluster, layout)
    positive("global_batch", global_batch)
    replicas = layout.dp * layout.micro_batch
    if global_batch % replicas:
        raise ValueError(f"global batch {global_batch} is not divisible by dp {layout.dp} x "
                         f"micro-batch {layout.micro_batch} = {replicas}")
    m = global_batch // replicas
    memory = estimate_memory(model, layout, m)
    time = estimate_time(model, cluster, layout, m, memory.params_per_gpu)
    return Plan(model, cluster, layout, global_batch, memory, time)


def plan(model: ModelSpec, cluster: Cluster, global_batch: int, tp: int | None = None,
         pp: int | None = None, accounting: str = "megatron",
         attention: str = "flash", tp_comm_overlap: bool = False) -> list[Plan]:
    """The layouts that fit in memory, fastest first (ties: less PP, less memory)."""
    positive("global_batch", global_batch)
    if tp is not None and (tp < 1 or cluster.gpus_per_node % tp):
        raise ValueError(f"tp {tp} must divide a node of {cluster.gpus_per_node} GPUs")
    if pp is not None and (pp < 1 or (cluster.num_gpus // (tp or 1)) % pp):
        raise ValueError(f"pp {pp} must divide the {cluster.num_gpus} GPUs / tp {tp or 1}")
    plans = [evaluate(model, cluster, layout, global_batch)
             for layout in candidate_layouts(model, cluster, global_batch, accounting,
                                             attention, tp, pp, tp_comm_overlap)]
    fitting = [p for p in plans if p.fits]
    if not fitting:
        raise ValueError(f"no layout of {model.name} ({model.num_params / 1e9:.1f}B parameters) "
                         f"fits on {cluster.num_gpus} GPUs of {cluster.gpu_memory_gib:g} GiB "
                         f"with global batch {global_batch}")
    return sorted(fitting, key=lambda p: (round(p.step_s, 4), p.layout.pp, p.memory_bytes))


def recommend(model: ModelSpec, cluster: Cluster, global_batch: int,
              accounting: str = "megatron", tp_comm_overlap: bool = False) -> tuple[Plan, Plan]:
    """The fastest fitting plan, and the fastest with a different TP x PP (the runner-up:
    the next choice of how to split the model, not the same split with the data axes
    reshuffled, CP 2 x DP 4 against CP 4 x DP 2, which the estimate cannot tell apart)."""
    ranked = plan(model, cluster, global_batch, accounting=accounting,
                  tp_comm_overlap=tp_comm_overlap)
    best = ranked[0]
    runner_up = next((p for p in ranked if p.key() != best.key()), best)
    return best, runner_up


def table(plans: list[Plan]) -> str:
    return "\n".join([TABLE_HEADER, *(p.row() for p in plans)])
