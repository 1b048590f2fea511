"""A layout: the degrees of each parallelism and the options that change memory and time, the
rules that make one legal, and every legal one for a model on a cluster."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from reference_impl.comm.parallel_dims import check_expert_split
from reference_impl.perf.planner.framework_memory import STAGES, check_accounting
from reference_impl.perf.planner.hardware import Cluster
from reference_impl.perf.planner.layer_efficiency import ATTENTION_KERNELS
from reference_impl.perf.planner.model_spec import ModelSpec
from reference_impl.tp.tp_splits import check_block_split

RECOMPUTE = (None, "selective", "full")
MICRO_BATCHES = (1, 2, 4)
CONTEXT_PARALLEL = (1, 2, 4)


@dataclass(frozen=True)
class Layout:
    """tp x cp x pp x dp GPUs (Megatron-LM's order: TP fastest, then CP, DP, PP); ``ep``
    expert-parallel ranks carved out of dp (Megatron-core's tp-cp-ep-dp-pp: each EP group
    holds every expert once, E / ep per rank, and exchanges tokens all-to-all); ``v``
    virtual stages per pipeline rank (the interleaved schedule, Narayanan et al. 2021);
    ``tp_comm_overlap``: TP collectives overlapped with the GEMMs, as Megatron-Core's option of
    that name does (time_estimate.py prices it); ``embedding_in_split``: the embedding and the
    loss count as a layer each when the layers are split into stages (Megatron-LM's
    --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split: the
    first and last stages hold one layer fewer, as Llama 3 405B's 126 layers on 16 stages)."""
    tp: int
    pp: int
    dp: int
    zero: int = 1
    micro_batch: int = 1
    recompute: str | None = None
    sequence_parallel: bool = True
    cp: int = 1
    v: int = 1
    accounting: str = "megatron"
    attention: str = "flash"
    tp_comm_overlap: bool = False
    embedding_in_split: bool = False
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def describe(self) -> str:
        return (f"TP {self.tp} x PP {self.pp}{f' (v {self.v})' if self.v > 1 else ''}"
                f"{f' x CP {self.cp}' if self.cp > 1 else ''} x DP {self.dp}"
                f"{f' (EP {self.ep})' if self.ep > 1 else ''}, "
                f"{self.accounting} ZeRO-{self.zero}, micro-batch {self.micro_batch}, "
                f"recompute {self.recompute or 'none'}"
                f"{', SP' if self.sequence_parallel and self.tp > 1 else ''}"
                f"{', TP comm overlapped' if self.tp_comm_overlap and self.tp > 1 else ''}")

    def short(self) -> str:
        """One line for tables: TP2 PP8 v10 CP2 DP4 mb1 (and the options that are not the
        default: ZeRO stage, recomputation)."""
        return (f"TP{self.tp} PP{self.pp}{f' v{self.v}' if self.v > 1 else ''}"
                f"{f' CP{self.cp}' if self.cp > 1 else ''} DP{self.dp}"
                f"{f' EP{self.ep}' if self.ep > 1 else ''} mb{self.micro_batch}"
                f"{f' ZeRO-{self.zero}' if self.zero != 1 else ''}"
                f"{f' {self.recompute}' if self.recompute else ''}")


def splits_block(model: ModelSpec, tp: int) -> bool:
    """Whether ``tp`` ranks split a block, its KV heads included (what the planner prices)."""
    try:
        return check_block_split(model.heads, model.kv_heads or model.heads, model.hidden,
                                 model.ffn, tp) == "split"
    except ValueError:
        return False


def check_layout(model: ModelSpec, cluster: Cluster, layout: Layout) -> None:
    """What the model, the cluster and the schedule allow; a ValueError names the numbers."""
    for name in ("tp", "pp", "dp", "cp", "ep", "v", "micro_batch"):
        value = getattr(layout, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    tp, cp, pp, dp = layout.tp, layout.cp, layout.pp, layout.dp
    if layout.gpus != cluster.num_gpus:
        raise ValueError(f"tp {tp} x cp {cp} x pp {pp} x dp {dp} = {layout.gpus}, but the "
                         f"cluster has {cluster.nodes} nodes x {cluster.gpus_per_node} = "
                         f"{cluster.num_gpus} GPUs")
    if tp > cluster.gpus_per_node:
        raise ValueError(f"tp {tp} is larger than a node ({cluster.gpus_per_node} GPUs): "
                         f"tensor parallelism must stay on the intra-node links")
    if cluster.gpus_per_node % tp:
        raise ValueError(f"tp {tp} does not divide the {cluster.gpus_per_node} GPUs of a node")
    kv_heads = model.kv_heads or model.heads
    if check_block_split(model.heads, kv_heads, model.hidden, model.ffn, tp) != "split":
        raise ValueError(f"tp {tp} would replicate the {kv_heads} key/value heads over the "
                         f"tensor-parallel ranks (the trainer can, tp/tp_splits.py); the planner "
                         f"prices split KV heads only: tp must divide kv_heads")
    if model.seq_len % (2 * cp if cp > 1 else 1):
        raise ValueError(f"cp {cp} needs the sequence {model.seq_len} split in 2 cp chunks "
                         f"(load balance): {model.seq_len} is not divisible by 2 x {cp}")
    check_expert_split(model.experts, layout.ep, dp, model.name)
    if layout.attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {ATTENTION_KERNELS}, got {layout.attention!r}")
    if cp > 1 and layout.attention != "flash":
        raise ValueError(f"context parallelism needs fused attention: cp {cp} with "
                         f"{layout.attention} attention (Megatron-Core runs CP only inside its "
                         f"fused attention kernel)")
    if pp > model.layers:
        raise ValueError(f"pp {pp} is more than the {model.layers} layers")
    if layout.v > 1 and pp == 1:
        raise ValueError(f"v {layout.v} virtual stages need pp > 1")
    if layout.v > 1 and pipeline_slots(model, layout) % (pp * layout.v):
        slots = pipeline_slots(model, layout)
        counted = " (the layers + the embedding and the loss)" if layout.embedding_in_split else ""
        raise ValueError(f"interleaving needs equal chunks: {slots} layers{counted} are not "
                         f"divisible by pp*v = {pp}*{layout.v} = {pp * layout.v}")
    if layout.embedding_in_split and pp == 1:
        raise ValueError("embedding_in_split needs pp > 1: it moves a layer off the first and "
                         "last stages")
    if layout.recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of none, selective, full, got {layout.recompute!r}")
    check_accounting(layout.accounting, layout.zero)


def expert_parallel_degrees(model: ModelSpec, dp: int) -> list[int]:
    """The ep a layout of ``dp`` replicas allows: the common divisors of dp and the experts."""
    return [e for e in divisors(dp) if model.experts % e == 0] if model.experts else [1]


def pipeline_slots(model: ModelSpec, layout: Layout) -> int:
    """What the pipeline split divides among the stages: the layers, plus the embedding and the
    loss as a layer each with ``embedding_in_split``."""
    return model.layers + (2 if layout.embedding_in_split else 0)


def first_stage_layers(model: ModelSpec, layout: Layout) -> int:
    """Layers on the first stage, the most any stage holds: ceil(slots / pp), one fewer when
    the embedding counts as a layer."""
    most = -(-pipeline_slots(model, layout) // layout.pp)
    return most - 1 if layout.embedding_in_split else most


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def virtual_stages(model: ModelSpec, pp: int, embedding_in_split: bool = False) -> list[int]:
    """The interleaving degrees a pipeline of ``pp`` ranks allows: equal model chunks, every v
    with pp x v dividing the layers (Megatron-LM's rule; with ``embedding_in_split`` the layers
    + 2). v = a stage's layers is one layer per chunk, as NeMo's Llama 2 70B recipe."""
    slots = model.layers + (2 if embedding_in_split else 0)
    if pp == 1 or slots % pp:
        return [1]
    return divisors(slots // pp)


def candidate_layouts(model: ModelSpec, cluster: Cluster, global_batch: int,
                      accounting: str = "megatron", attention: str = "flash",
                      tp: int | None = None, pp: int | None = None,
                      tp_comm_overlap: bool = False):
    """Every legal layout: TP within a node, CP in {1, 2, 4}, PP dividing what is left (with
    virtual stages where the layers divide), DP the rest; each ZeRO stage the accounting has,
    micro-batch 1, 2 or 4, and recomputation (with flash attention "selective" is "none": the
    kernel already recomputes the scores). CP only with flash attention. With experts, EP of
    every degree dividing dp and the experts."""
    g = cluster.num_gpus
    recomputes = (None, "full") if attention == "flash" else RECOMPUTE
    for t in divisors(cluster.gpus_per_node):
        if not splits_block(model, t) or (tp and t != tp):
            continue
        for c in CONTEXT_PARALLEL if attention == "flash" else (1,):
            if (g // t) % c or model.seq_len % (2 * c if c > 1 else 1):
                continue
            for p in divisors(g // (t * c)):
                if p > model.layers or (pp and p != pp):
                    continue
                d = g // (t * c * p)
                for v, e in itertools.product(virtual_stages(model, p),
                                              expert_parallel_degrees(model, d)):
                    for zero in STAGES[accounting]:
                        if zero and d * c == 1:
                            continue
                        for b in MICRO_BATCHES:
                            if global_batch % (d * b):
                                continue
                            for recompute in recomputes:
                                yield Layout(t, p, d, zero, b, recompute, True, c, v,
                                             accounting, attention, tp_comm_overlap, ep=e)
