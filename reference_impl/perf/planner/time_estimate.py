"""Step time of a layout, term by term, communication overlapped as the frameworks overlap it.

Per microbatch and stage (``layer`` from the GPU's :class:`LayerEfficiency`)::

    layer'   = layer x (4/3 under full recomputation; + the attention forward again under
               selective recomputation of explicit attention, Korthikanti et al. 2022)
               + TP: k ring all-reduces of b (s/cp) h 2 bytes over tp GPUs on NVLink, k = 4
                 (6 under full recomputation); with sequence parallelism the all-gather +
                 reduce-scatter pairs move the same bytes; not overlapped
               + CP: the ring exchange of K and V (forward, and twice that backward) beyond
                 what the attention it overlaps with hides
    stage    = max(ceil(L/pp) layer', (L layer' + LM head) / pp): whole layers per stage, the
               LM head on the last stage balanced by giving it fewer layers (as Llama 3 did)
    pipeline = makespan_formula('1f1b' or 'interleaved', p, m, v) with F + B = stage:
               stage (m + (p-1)/v), the bubble (p-1)/(v m + p-1)
    sends    = 2 v (p-1) (alpha + b (s/cp) h 2 / (tp with SP) / link): the stage-boundary
               activations and gradients on the critical path of warm-up and cool-down; in the
               steady state they overlap the next microbatch's compute (batched isend/irecv)
    DP       = gradients reduced once per step, bucketed, overlapped with the last microbatch's
               backward (2/3 of a stage slot): exposed max(0, reduce - that); the parameter
               all-gather overlapped with the next step's first forward (1/3 of a slot);
               ZeRO-3 (and DeepSpeed's ZeRO-2 reduce-scatter) every micro-step, overlapped with
               that microbatch's compute: m x max(0, traffic - stage)
    optimizer = 30 bytes per local parameter shard at memory bandwidth (Adam: fp32 master,
               gradient, m and v read and written, the bf16 copy written)
    step     = pipeline + sends + DP + optimizer

Ring collectives use lab 0's alpha-beta cost (:func:`ring_all_reduce_seconds`); a
reduce-scatter or an all-gather is half an all-reduce. A group lies inside a node when the GPUs
it spans (Megatron-LM's order: TP fastest, then CP, DP, PP) fit in one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from reference_impl.comm.alpha_beta import ring_all_reduce_seconds
from reference_impl.perf.planner.framework_memory import gradient_traffic
from reference_impl.perf.planner.hardware import Cluster
from reference_impl.perf.planner.layout import Layout
from reference_impl.perf.planner.model_spec import ModelSpec
from reference_impl.pipeline.pipeline_simulator import bubble_formula, makespan_formula

OPTIMIZER_BYTES_PER_PARAMETER = 30


@dataclass(frozen=True)
class TimeEstimate:
    layer_s: float            # one layer, forward + backward, as the GPU computes it
    recompute_s: float        # added per layer by recomputation
    tp_comm_s: float          # per layer and microbatch
    cp_exposed_s: float       # per layer and microbatch
    head_s: float             # the LM head, on the last stage, per microbatch
    stage_s: float            # one microbatch through the slowest stage
    microbatches: int
    bubble: float
    pipeline_s: float
    sends_s: float
    dp_s: float
    optimizer_s: float

    @property
    def step_s(self) -> float:
        return self.pipeline_s + self.sends_s + self.dp_s + self.optimizer_s


def ring_seconds(nbytes: float, n: int, link: tuple[float, float], all_reduce: bool = True) -> float:
    if n == 1 or nbytes == 0:
        return 0.0
    alpha, bandwidth = link
    seconds = ring_all_reduce_seconds(nbytes, n, alpha, bandwidth)
    return seconds if all_reduce else seconds / 2


def estimate_time(model: ModelSpec, cluster: Cluster, layout: Layout, microbatches: int,
                  params_per_gpu: float) -> TimeEstimate:
    eff = cluster.gpu.layer
    tp, cp, pp, dp, v, b = layout.tp, layout.cp, layout.pp, layout.dp, layout.v, layout.micro_batch
    m, s_local = microbatches, model.seq_len // cp
    layer = eff.layer_seconds(model, tp, b, cp, layout.attention)
    head_dim, heads_local = model.hidden // model.heads, model.heads // tp
    attention = eff.attention_seconds(b, s_local, model.seq_len, heads_local, head_dim,
                                      layout.attention)
    if layout.recompute == "full":
        recompute = layer / 3
    elif layout.recompute == "selective" and layout.attention == "explicit":
        recompute = attention / 3
    else:
        recompute = 0.0

    boundary = b * s_local * model.hidden * 2
    all_reduces = 6 if layout.recompute == "full" else 4
    tp_comm = all_reduces * ring_seconds(boundary, tp, cluster.link(tp))
    if cp > 1:  # each rank passes (cp-1) K,V chunks round the ring; backward moves dK, dV too
        kv_chunk = 2 * b * s_local * model.kv_dim // tp * 2
        alpha, bandwidth = cluster.link(tp * cp)
        exchange = 3 * (cp - 1) * (alpha + kv_chunk / bandwidth)
        cp_exposed = max(0.0, exchange - attention)
    else:
        cp_exposed = 0.0

    layer_total = layer + recompute + tp_comm + cp_exposed
    head = eff.gemm_only_seconds(b * s_local, model.hidden, model.vocab // tp)
    stage = max(math.ceil(model.layers / pp) * layer_total,
                (model.layers * layer_total + head) / pp)
    schedule = "interleaved" if v > 1 else "1f1b"
    pipeline = makespan_formula(schedule, pp, m, v, cost_f=stage / 3, cost_b=2 * stage / 3)
    bubble = bubble_formula(schedule, pp, m, v)

    if pp > 1:
        alpha, bandwidth = cluster.link(tp * cp * dp * pp)
        send_bytes = boundary / tp if layout.sequence_parallel else boundary
        sends = 2 * v * (pp - 1) * (alpha + send_bytes / bandwidth)
    else:
        sends = 0.0

    shards = dp * cp
    link = cluster.link(tp * cp * dp)
    traffic = gradient_traffic(params_per_gpu, layout.zero, layout.accounting)
    reduce = ring_seconds(traffic.reduce_per_step, shards, link, traffic.reduce_is_all_reduce)
    gather = ring_seconds(traffic.gather_per_step, shards, link, all_reduce=False)
    per_microstep = ring_seconds(traffic.per_microstep, shards, link, all_reduce=False)
    dp_time = (max(0.0, reduce - 2 * stage / 3) + max(0.0, gather - stage / 3)
               + m * max(0.0, per_microstep - stage))
    optimizer = (OPTIMIZER_BYTES_PER_PARAMETER * params_per_gpu
                 / (shards if layout.zero else 1) / eff.memory_bandwidth)
    return TimeEstimate(layer, recompute, tp_comm, cp_exposed, head, stage, m, bubble,
                        pipeline, sends, dp_time, optimizer)
