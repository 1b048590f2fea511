"""Step time of a layout, term by term, communication overlapped as the frameworks overlap it.

Per microbatch and stage a layer's time (``LayerEfficiency`` at the clock under load) plus
recomputation and the TP, CP and EP collectives; the pipeline's makespan at its slowest stage;
the framework's time per micro-step; the stage-boundary sends; the data-parallel reduction in
buckets, overlapped as Megatron-LM and FSDP overlap it; the optimizer. TP overlap follows
Megatron-Core's ``tp_comm_overlap`` (Wang et al. 2023). The formula, term by term:
docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from reference_impl.perf.planner.cluster_compute import ClusterTerms
from reference_impl.perf.planner.dp_collectives import (bucket_parameters, bucketed_seconds,
                                                        ring_seconds)
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
    tp_comm_s: float          # per layer and microbatch, the collectives' time
    tp_exposed_s: float       # per layer and microbatch, what the layer waits for
    cp_exposed_s: float       # per layer and microbatch
    head_s: float             # the LM head, on the last stage, per microbatch
    stage_layers: int         # layers on the slowest stage
    stage_has_head: bool      # whether the slowest stage is the last (with the LM head)
    stage_s: float            # one microbatch through the slowest stage
    microbatches: int
    bubble: float
    pipeline_s: float
    sends_s: float
    dp_s: float
    optimizer_s: float
    framework_s: float = 0.0
    ep_exposed_s: float = 0.0  # per layer and microbatch, the all-to-alls of the experts

    @property
    def step_s(self) -> float:
        return self.pipeline_s + self.framework_s + self.sends_s + self.dp_s + self.optimizer_s

    def breakdown(self) -> dict[str, float]:
        """Seconds per step by cause; they add up to ``step_s``. The work of the slowest
        stage times the microbatches, then the pipeline's idle time and what follows it."""
        m, n = self.microbatches, self.stage_layers
        terms = {"layers": m * n * self.layer_s, "recompute": m * n * self.recompute_s,
                 "TP": m * n * self.tp_exposed_s, "CP": m * n * self.cp_exposed_s,
                 "EP": m * n * self.ep_exposed_s,
                 "LM head": m * self.head_s if self.stage_has_head else 0.0}
        terms["bubble"] = self.pipeline_s - m * self.stage_s
        terms.update({"framework": self.framework_s, "sends": self.sends_s, "DP": self.dp_s,
                      "optimizer": self.optimizer_s})
        return terms


def exposed_seconds(collective_s: float, v: int, pp: int, pass_s: float,
                    last_s: float = 0.0) -> float:
    """How long a once-per-step collective runs past the compute it overlaps: the gradient
    reduction after the last backward (``pass_s`` = one microbatch's backward through the
    stage), or, mirrored, the parameter gather before the first forward. The collective is
    split into the v chunks' shares, sent one after another; chunk k's share is ready
    (k pp + 1) pass_s / v before the end (its own last backward overlaps it by buckets, and
    k pp chunk-backwards of the interleaved cool-down follow it). v = 1: max(0, collective -
    pass). ``last_s``, the last bucket, is exposed whatever the overlap: it starts when the
    pass ends."""
    share, finish = collective_s / v, -math.inf
    for k in reversed(range(v)):
        finish = max(finish, -(k * pp + 1) * pass_s / v) + share
    return max(0.0, last_s, finish)


def tp_exposed_seconds(tp_comm: float, gemms: float, tp: int, overlap: bool,
                       terms: ClusterTerms) -> float:
    """What a layer waits for of its TP collectives (docs/library.md)."""
    if not overlap or tp_comm == 0:
        return tp_comm
    if terms.tp_overlap_bound:
        return max(0.0, tp_comm - gemms)
    return (max(tp_comm / tp, tp_comm - gemms)
            + terms.overlap_slowdown(tp_comm * (1 - 1 / tp), gemms))


def slowest_stage(layers: int, pp: int, layer_s: float, head_s: float) -> tuple[int, bool]:
    """The slowest of ``pp`` stages under the best split, as (its layers, whether it is the
    last stage, which runs the LM head). Stages hold whole layers, at most ceil(layers/pp)
    each; the last may hold k fewer to make room for the head. The pipeline runs at the pace
    of its slowest stage, so that stage, not the average (layers x layer + head) / pp, is the
    slot of the schedule: 80 layers on 16 stages leave 5 on every stage, and the last one's
    5 layers + the head set the pace."""
    if pp == 1:
        return layers, True
    most = math.ceil(layers / pp)
    splits = []
    for k in range(max(0, layers - (pp - 1) * most), most + 1):  # k layers on the last stage
        others = math.ceil((layers - k) / (pp - 1))
        last_s, other_s = k * layer_s + head_s, others * layer_s
        splits.append((last_s, True, k) if last_s >= other_s else (other_s, False, others))
    _, with_head, n = min(splits)
    return n, with_head


def estimate_time(model: ModelSpec, cluster: Cluster, layout: Layout, microbatches: int,
                  params_per_gpu: float) -> TimeEstimate:
    eff, terms = cluster.gpu.layer, cluster.terms
    tp, cp, pp, dp, v, b = layout.tp, layout.cp, layout.pp, layout.dp, layout.v, layout.micro_batch
    m, s_local = microbatches, model.seq_len // cp
    layer = eff.layer_seconds(model, tp, b, cp, layout.attention) / terms.clock
    gemms = eff.layer_gemm_seconds(model, tp, b, cp) / terms.clock
    head_dim, heads_local = model.hidden // model.heads, model.heads // tp
    attention = eff.attention_seconds(b, s_local, model.seq_len, heads_local, head_dim,
                                      layout.attention) / terms.clock
    if layout.recompute == "full":
        recompute, gemms = layer / 3, gemms * 4 / 3
    elif layout.recompute == "selective" and layout.attention == "explicit":
        recompute = attention / 3
    else:
        recompute = 0.0

    boundary = b * s_local * model.hidden * 2
    all_reduces = 6 if layout.recompute == "full" else 4
    tp_comm = all_reduces * ring_seconds(boundary, tp, cluster.link(tp))
    tp_exposed = tp_exposed_seconds(tp_comm, gemms, tp, layout.tp_comm_overlap, terms)
    if cp > 1:  # each rank passes (cp-1) K,V chunks round the ring; backward moves dK, dV too
        kv_chunk = 2 * b * s_local * model.kv_dim // tp * 2
        alpha, bandwidth = cluster.link(tp * cp)
        exchange = 3 * (cp - 1) * (alpha + kv_chunk / bandwidth)
        cp_exposed = max(0.0, exchange - attention) + terms.overlap_slowdown(exchange, attention)
    else:
        cp_exposed = 0.0

    ep_exposed = all_to_all_seconds(model, cluster, layout)
    layer_total = layer + recompute + tp_exposed + cp_exposed + ep_exposed
    head = eff.gemm_only_seconds(b * s_local, model.hidden, model.vocab // tp) / terms.clock
    stage_layers, stage_has_head = slowest_stage(model.layers, pp, layer_total, head)
    stage = stage_layers * layer_total + (head if stage_has_head else 0.0)
    schedule = "interleaved" if v > 1 else "1f1b"
    pipeline = makespan_formula(schedule, pp, m, v, cost_f=stage / 3, cost_b=2 * stage / 3)
    bubble = bubble_formula(schedule, pp, m, v)

    if pp > 1:
        alpha, bandwidth = cluster.link(tp * cp * dp * pp)
        send_bytes = boundary / tp if layout.sequence_parallel else boundary
        sends = 2 * v * (pp - 1) * (alpha + send_bytes / bandwidth)
    else:
        sends = 0.0

    shards = dp * cp  # the distributed optimizer's group: DP x CP, ranks tp apart
    traffic = gradient_traffic(params_per_gpu, layout.zero, layout.accounting)
    buckets = max(v, math.ceil(params_per_gpu / bucket_parameters(
        params_per_gpu, shards, layout.accounting, stage_layers)))

    def sent(nbytes, all_reduce=False):
        return bucketed_seconds(nbytes, buckets, shards, tp, cluster, all_reduce)

    reduce, reduce_last = sent(traffic.reduce_per_step, traffic.reduce_is_all_reduce)
    gather, gather_last = sent(traffic.gather_per_step)
    per_microstep, _ = sent(traffic.per_microstep)
    reduce_exposed = exposed_seconds(reduce, v, pp, 2 * stage / 3, reduce_last)
    gather_exposed = exposed_seconds(gather, v, pp, stage / 3, gather_last)
    per_microstep_exposed = max(0.0, per_microstep - stage)
    overlapped = (max(0.0, reduce - reduce_exposed) + max(0.0, gather - gather_exposed)
                  + m * (per_microstep - per_microstep_exposed))
    dp_time = (reduce_exposed + gather_exposed + m * per_microstep_exposed
               + terms.overlap_slowdown(overlapped, overlapped))
    framework = 2 * (v * m + pp - 1) * terms.overhead_s(layout.accounting)
    optimizer = (OPTIMIZER_BYTES_PER_PARAMETER * params_per_gpu
                 / (shards if layout.zero else 1) / eff.memory_bandwidth)
    return TimeEstimate(layer, recompute, tp_comm, tp_exposed, cp_exposed, head, stage_layers,
                        stage_has_head, stage, m, bubble, pipeline, sends, dp_time, optimizer,
                        framework, ep_exposed)


def all_to_all_seconds(model: ModelSpec, cluster: Cluster, layout: Layout) -> float:
    """One layer's expert all-to-alls per microbatch (docs/library.md's EP term): rows =
    b (s/cp) k, each exchange (ep-1)/ep of rows x h x 2 bytes; 0 without expert parallelism."""
    ep = layout.ep
    if ep == 1 or not model.experts:
        return 0.0
    rows = layout.micro_batch * (model.seq_len // layout.cp) * model.top_k
    leaving = rows * model.hidden * 2 * (ep - 1) / ep
    exchanges = 2 * (3 if layout.recompute == "full" else 2)  # (dispatch, combine) x passes
    alpha, bandwidth = cluster.link(layout.tp * layout.cp * ep)
    return exchanges * ((ep - 1) * alpha + leaving / bandwidth)
