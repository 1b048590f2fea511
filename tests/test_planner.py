"""The 3D-parallelism planner (the course notes "Week 15 - Tensor Parallelism and Pipeline
Parallelism", 15.5): its choice for 70B on 16 x 8 H100, published
layouts that must fit by its memory estimate, ones that must not, the shared formulas it is
built from, and its errors. Pure Python: no process group, no tensors."""
import pytest

from reference_impl.memory.activation_memory import activation_memory_formula
from reference_impl.comm.alpha_beta import ring_all_reduce_seconds
from reference_impl.pipeline.pipeline_simulator import bubble_formula
from reference_impl.perf.planner import (Cluster, Layout, ModelSpec, evaluate, explain,
                                    get_model, main, plan, recommend)
from reference_impl.hybrid.zero import zero_memory_formula

H100 = Cluster(gpus_per_node=8, nodes=16, gpu_memory_gib=80)
# Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM"), Table 1: GPT models with vocabulary 51200 and sequence length 2048 on 80 GB
# A100s (8 per node), micro-batch 1, with activation recomputation; the data-parallel degree is
# GPUs / (tp * pp).
A100 = dict(gpus_per_node=8, gpu_memory_gib=80, intra_bw_gbs=300, inter_bw_gbs=25,
            peak_tflops=312)
NARAYANAN_TABLE_1 = [  # name, layers, hidden, heads, tp, pp, GPUs, global batch
    ("145.6B", 80, 12288, 96, 8, 8, 1536, 2304),
    ("529.6B", 105, 20480, 128, 8, 35, 2520, 2520),
    ("1008.0B", 128, 25600, 160, 8, 64, 3072, 3072),
]


def test_70b_on_16_nodes_of_8_h100_follows_the_week_15_rules():
    model = get_model("70b")
    assert 70e9 < model.num_params < 71e9  # Llama 3 70B: 70.6B
    best = plan(model, H100, global_batch=1024)[0]
    lay = best.layout
    assert lay.tp <= 8 and 8 % lay.tp == 0, "TP stays inside a node"
    assert lay.pp <= 8, "PP stays small"
    assert lay.tp * lay.pp * lay.dp == 128, "DP fills the rest"
    assert best.fits


def test_70b_on_16_nodes_of_8_h100_is_recommended_tp_8_small_pp_dp_the_rest():
    chosen = recommend(get_model("70b"), H100, global_batch=1024)
    tp, pp, dp = chosen.layout.tp, chosen.layout.pp, chosen.layout.dp
    assert (tp, tp * pp * dp) == (8, 128), f"TP {tp} x PP {pp} x DP {dp}: TP must fill the node"
    assert pp <= 8 and dp == 128 // (tp * pp) and chosen.fits
    # PP from memory: with TP 8, no smaller PP fits.
    assert all(p.layout.pp >= pp for p in plan(get_model("70b"), H100, 1024, tp=8))


def test_70b_with_tp_fixed_to_the_node_gives_small_pp_and_dp_for_the_rest():
    best = plan(get_model("70b"), H100, global_batch=1024, tp=8)[0]
    tp, pp, dp = best.layout.tp, best.layout.pp, best.layout.dp
    assert tp == 8
    assert pp <= 8
    assert dp == 128 // (tp * pp)
    overall = plan(get_model("70b"), H100, global_batch=1024)[0]
    # the Week 15 notes' rule of thumb is within 10% of the model's optimum
    assert best.step_s <= 1.10 * overall.step_s


@pytest.mark.parametrize("name, layers, hidden, heads, tp, pp, gpus, batch", NARAYANAN_TABLE_1)
def test_published_megatron_layouts_fit(name, layers, hidden, heads, tp, pp, gpus, batch):
    model = ModelSpec(name, layers, hidden, heads, 51200, 2048, tied_embeddings=True)
    assert model.num_params / 1e9 == pytest.approx(float(name[:-1]), rel=2e-3)
    cluster = Cluster(nodes=gpus // 8, **A100)
    layout = Layout(tp, pp, gpus // (tp * pp), zero=0, micro_batch=1, recompute="full",
                    sequence_parallel=False)
    assert evaluate(model, cluster, layout, batch).fits
    # and they needed the recomputation: without it, none of them fits
    no_recompute = Layout(tp, pp, gpus // (tp * pp), 0, 1, None, False)
    assert not evaluate(model, cluster, no_recompute, batch).fits


def test_llama3_405b_layout_fits():
    # Dubey et al. 2024 (The Llama 3 Herd of Models), Table 4: 8192 H100s, TP 8, PP 16,
    # DP 64, sequence 8192, 16M tokens per batch (2048 sequences); optimizer states sharded
    # over DP (FSDP); recomputation is not in the table, so full recomputation here.
    model = get_model("405b")
    assert 404e9 < model.num_params < 407e9
    cluster = Cluster(gpus_per_node=8, nodes=1024, gpu_memory_gib=80)
    layout = Layout(8, 16, 64, zero=1, micro_batch=1, recompute="full")
    assert evaluate(model, cluster, layout, global_batch=2048).fits


def test_clearly_infeasible_layouts_do_not_fit():
    model = get_model("70b")
    replicated = evaluate(model, H100, Layout(1, 1, 128, zero=0, recompute="full"), 1024)
    assert not replicated.fits
    assert replicated.model_state_bytes == 16 * model.num_params  # 1.1 TB per GPU
    with pytest.raises(ValueError, match="no layout of 405b"):
        plan(get_model("405b"), Cluster(nodes=1), global_batch=64)


def test_memory_and_time_are_the_shared_formulas():
    model, cl = get_model("70b"), H100
    layout = Layout(8, 4, 4, zero=1, micro_batch=1, recompute="selective")
    p = evaluate(model, cl, layout, global_batch=1024)
    s, h, a = model.seq_len, model.hidden, model.heads
    per_gpu = model.num_params / 32
    assert p.model_state_bytes == zero_memory_formula(per_gpu, 4, 1)
    per_layer = activation_memory_formula(s, 1, h, a, 8, sequence_parallel=True,
                                          recompute="selective")
    assert p.activation_bytes == per_layer * (80 // 4) * 4  # layers/stage x pp in flight
    assert p.memory_bytes == p.model_state_bytes + p.activation_bytes
    m = 1024 // 4
    assert p.microbatches == m
    assert p.bubble == bubble_formula("1f1b", 4, m) == pytest.approx(3 / (m + 3))
    assert p.dp_comm_s == ring_all_reduce_seconds(2 * per_gpu, 4, cl.inter_alpha,
                                                  cl.inter_bw_gbs * 1e9)
    tp_one = ring_all_reduce_seconds(s * h * 2, 8, cl.intra_alpha, cl.intra_bw_gbs * 1e9)
    assert p.tp_comm_s == pytest.approx(20 * m * 4 * tp_one)
    compute = 6 * model.num_params * 1024 * s / (128 * cl.peak_tflops * 1e12 * cl.mfu)
    assert p.compute_s == pytest.approx(compute * (1 + s / (3 * (6 * h + s))))
    full = evaluate(model, cl, Layout(8, 4, 4, 1, 1, "full"), 1024)
    assert full.compute_s == pytest.approx(compute * 4 / 3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=8, pp=4, dp=2), r"tp 8 x pp 4 x dp 2 = 64, but the cluster has 16 nodes x 8 = 128"),
    (dict(tp=16, pp=1, dp=8), r"tp 16 is larger than a node \(8 GPUs\)"),
    (dict(tp=8, pp=0, dp=16), r"pp must be a positive integer, got 0"),
])
def test_bad_layouts_name_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        evaluate(get_model("70b"), H100, Layout(**kwargs), global_batch=1024)


def test_bad_inputs_name_the_numbers():
    with pytest.raises(ValueError, match=r"unknown preset '80b'"):
        get_model("80b")
    with pytest.raises(ValueError, match=r"nodes must be a positive number, got -2"):
        Cluster(nodes=-2)
    with pytest.raises(ValueError, match=r"hidden must be a positive number, got 0"):
        ModelSpec("x", 2, 0, 1, 10, 10)
    with pytest.raises(ValueError, match=r"global batch 1000 is not divisible by dp 16"):
        evaluate(get_model("70b"), H100, Layout(8, 1, 16), global_batch=1000)


def test_explain_shows_the_math():
    best = plan(get_model("70b"), H100, global_batch=1024)[0]
    text = explain(best)
    for needle in ("N = 70.55B parameters", "zero_memory_formula", "activation_memory_formula",
                   "bubble_formula('1f1b'", "6 N tokens / (GPUs x peak x MFU)", "step"):
        assert needle in text


def test_cli_prints_a_ranked_table_and_the_explanation(capsys):
    main(["--preset", "70b", "--nodes", "16", "--gpus-per-node", "8", "--top", "3",
          "--explain"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "layouts fit; the 3 fastest" in lines[0]
    assert lines[1].split()[:3] == ["tp", "pp", "dp"]
    steps = [float(line.split()[-1]) for line in lines[2:5]]
    assert steps == sorted(steps)
    assert "memory per GPU" in out and "time per step" in out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "80b"], "unknown preset '80b'"),
    (["--nodes", "0"], "nodes must be a positive number, got 0"),
    (["--tp", "16"], "tp 16 must divide a node of 8 GPUs"),
])
def test_cli_reports_bad_input_without_a_traceback(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err
    assert "Traceback" not in err
