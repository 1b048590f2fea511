"""The cluster the planner prices: end-to-end terms (clock under load, SMs of overlapped
collectives, framework time), data-parallel traffic that grows with the nodes, legal layouts
only, and ``cluster_of`` with a GPU given."""

import pytest

from reference_impl.perf.planner import Layout, cluster_of, evaluate, get_model
from reference_impl.perf.planner.calibrate import main as calibrate_main
from reference_impl.perf.planner.cluster_compute import (BEST_CASE, CLOCK_UNDER_LOAD,
                                                         MICROSTEP_OVERHEAD_S, NCCL_SM_SHARE)
from reference_impl.perf.planner.dp_collectives import (across_nodes_seconds, collective_seconds,
                                                        ranks_per_node)
from reference_impl.perf.planner.hardware import GB, GPUS, gpu_with_memory
from reference_impl.perf.planner.layout import candidate_layouts, virtual_stages
from reference_impl.perf.planner.published_runs import PUBLISHED_RUNS, TORCHTITAN

MODEL = get_model("70b")


def test_cluster_of_accepts_a_gpu():
    big = gpu_with_memory("h100", 94)
    assert cluster_of("h100", 2, gpu=big).gpu.memory_gib == 94  # no TypeError
    cluster = cluster_of(big, 2)
    assert cluster.gpu is big and cluster.inter_bw_gbs == 40.0
    assert cluster.terms.clock == CLOCK_UNDER_LOAD["h100"]
    assert cluster_of(GPUS["a100"], 1).terms.clock == 1.0


def test_the_clock_under_load_and_the_framework_slow_a_step():
    layout = Layout(4, 4, 8, v=5)
    real = evaluate(MODEL, cluster_of("h100", 16), layout, 1024)
    best = evaluate(MODEL, cluster_of("h100", 16, terms=BEST_CASE), layout, 1024)
    assert real.time.layer_s == pytest.approx(best.time.layer_s / 0.90)
    m = real.microbatches
    assert real.time.framework_s == pytest.approx(2 * (5 * m + 3) * MICROSTEP_OVERHEAD_S["megatron"])
    assert best.time.framework_s == 0
    deepspeed = evaluate(MODEL, cluster_of("h100", 16), Layout(4, 4, 8, zero=1,
                                                               accounting="deepspeed"), 1024)
    megatron = evaluate(MODEL, cluster_of("h100", 16), Layout(4, 4, 8), 1024)
    assert deepspeed.time.framework_s == pytest.approx(3 * megatron.time.framework_s)


def test_a_group_with_ranks_on_a_node_shares_its_nics():
    cluster = cluster_of("h100", 8)
    assert ranks_per_node(cluster, 64, 1) == 8 and ranks_per_node(cluster, 8, 8) == 1
    nbytes = 4e9
    spread = collective_seconds(nbytes, 8, 8, cluster)        # one rank a node: one NIC each
    packed = collective_seconds(nbytes, 64, 1, cluster)       # 8 a node: 8 NICs' worth
    assert spread == pytest.approx(2 * 7 * 10e-6 + 2 * 7 / 8 * nbytes / (40 * GB))
    assert packed < spread / 4


def test_dp_traffic_grows_with_the_nodes_and_the_tree_takes_over():
    # ring latency grows as N, the tree's as log2 N: NCCL's choice at many nodes is the tree
    alpha, bandwidth = 10e-6, 40 * GB
    assert across_nodes_seconds(1e6, 1024, alpha, bandwidth) < 2 * 1023 * alpha
    assert across_nodes_seconds(1e6, 1024, alpha, bandwidth) == pytest.approx(
        2 * 10 * alpha + 2 * 1e6 / bandwidth)
    # at a fixed batch per GPU the exposed reduction grows with DP: Megatron-LM's buckets grow
    # as 1M x dp parameters, and the last one starts only when the backward ends
    exposed = []
    for dp in (8, 64, 512):
        cluster = cluster_of("h100", 4 * dp)
        exposed.append(evaluate(MODEL, cluster, Layout(8, 4, dp, v=5), 16 * dp).time.dp_s)
    assert exposed[0] < exposed[1] < exposed[2]
    assert exposed[2] > 1.4 * exposed[0]


def test_overlapped_collectives_take_sms():
    cluster = cluster_of("h100", 16)
    assert cluster.terms.overlap_slowdown(2.0, 1.0) == pytest.approx(NCCL_SM_SHARE)
    assert BEST_CASE.overlap_slowdown(2.0, 1.0) == 0.0


def test_only_legal_layouts_are_enumerated():
    assert virtual_stages(get_model("gpt3-175b"), 9) == [1]  # 96 on 9 stages: no equal chunks
    assert virtual_stages(get_model("405b"), 16) == [1]
    assert virtual_stages(get_model("405b"), 16, embedding_in_split=True) == [1, 2, 4, 8]
    cluster = cluster_of("h100", 4)
    for attention in ("flash", "explicit"):
        for layout in candidate_layouts(MODEL, cluster, 256, attention=attention):
            assert layout.v == 1 or MODEL.layers % (layout.pp * layout.v) == 0
            assert layout.cp == 1 or attention == "flash"


def test_torchtitan_rows_count_every_parameter():
    run = next(r for r in PUBLISHED_RUNS if r.source == TORCHTITAN)
    flops = run.flops(run.model, 1)
    assert flops == pytest.approx(run.model.model_flops_per_token() * run.model.seq_len)


def test_calibrate_measures_a_layer_with_a_concurrent_all_reduce(capsys):
    calibrate_main(["--cluster-terms", "--dry-run"])
    out = capsys.readouterr().out
    assert "layer alone" in out and "all-reduce alone" in out and "together" in out
    assert "clock under load: not readable here" in out
