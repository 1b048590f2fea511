"""The topology planner: its recommendation for 70B on 16 x 8 H100, the shared formulas it is
built from, memory as the frameworks allocate it, and its errors. Pure Python: no process
group, no tensors. Validation against published runs: tests/library/planner/test_planner_validation.py; the
layer-efficiency model and calibration: tests/library/planner/test_planner_efficiency.py."""
import pytest

from reference_impl.perf.capacity import activation_bytes_with_recompute
from reference_impl.memory.model_states import zero_memory_formula
from reference_impl.perf.planner import Layout, cluster_of, evaluate, get_model, plan, recommend
from reference_impl.perf.planner.cli import main
from reference_impl.perf.planner.explain import explain, why
from reference_impl.perf.planner.cluster_compute import BEST_CASE
from reference_impl.perf.planner.dp_collectives import bucketed_seconds
from reference_impl.perf.planner.framework_memory import gradient_traffic, model_state_bytes
from reference_impl.perf.planner.layer_activations import activation_bytes
from reference_impl.perf.planner.time_estimate import exposed_seconds, slowest_stage
from reference_impl.pipeline.pipeline_simulator import bubble_formula

H100 = cluster_of("h100", nodes=16)
MODEL = get_model("70b")


def test_70b_recommendation_fits_and_beats_its_runner_up():
    best, runner_up = recommend(MODEL, H100, global_batch=1024)
    assert 70e9 < MODEL.num_params < 71e9  # Llama 3 70B: 70.55B
    assert best.fits and runner_up.fits
    assert best.layout.gpus == 128 and best.layout.tp <= 8
    assert best.key() != runner_up.key()
    assert best.step_s <= runner_up.step_s
    assert 0.3 < best.mfu < 0.75, "an H100 layer reaches at most ~0.69 of peak"


def test_memory_is_the_shared_formulas_on_each_stage():
    layout = Layout(8, 4, 4, zero=1, micro_batch=1, recompute="selective", attention="explicit",
                    accounting="zero")
    p = evaluate(MODEL, H100, layout, global_batch=1024)
    per_layer = activation_bytes(MODEL, 4096, 1, 8, sequence_parallel=True,
                                 recompute="selective", attention="explicit")
    assert p.memory.activation_per_layer_bytes == per_layer
    # the real shapes: SwiGLU's 3 x 28672 outweighs GQA's smaller K and V against GPT's 32 sbh/t
    gpt = activation_bytes_with_recompute(4096, 1, 8192, 64, 8, sequence_parallel=True,
                                          recompute="selective", dropout=False)
    assert per_layer == pytest.approx(gpt * (4 + (8192 * 2 + 2 * 1024 + 3 * 28672) / 8192) / 16)
    assert p.memory.activation_bytes == pytest.approx(per_layer * 20 * 4)  # 1F1B: pp in flight
    first_stage = 20 * MODEL.params_per_layer / 8 + MODEL.vocab * MODEL.hidden / 8
    assert p.memory.params_per_gpu == pytest.approx(first_stage)  # the embedding on stage 0
    assert p.memory.model_state_bytes == pytest.approx(zero_memory_formula(first_stage, 4, 1))


def test_interleaving_shrinks_the_bubble_and_grows_what_is_in_flight():
    plain = evaluate(MODEL, H100, Layout(8, 4, 4, micro_batch=1), 1024)
    interleaved = evaluate(MODEL, H100, Layout(8, 4, 4, micro_batch=1, v=5), 1024)
    m = plain.microbatches
    assert plain.time.bubble == pytest.approx(bubble_formula("1f1b", 4, m))
    assert interleaved.time.bubble == pytest.approx(bubble_formula("interleaved", 4, m, 5))
    assert interleaved.time.bubble < plain.time.bubble
    assert interleaved.memory.in_flight == pytest.approx(4 * (1 + 3 / (4 * 5)))


def test_flash_attention_drops_the_s2_term():
    explicit = evaluate(MODEL, H100, Layout(8, 4, 4, attention="explicit"), 1024)
    flash = evaluate(MODEL, H100, Layout(8, 4, 4, attention="flash"), 1024)
    assert flash.memory.activation_per_layer_bytes < explicit.memory.activation_per_layer_bytes / 3


def test_framework_accountings():
    n, d = 1e9, 16
    assert model_state_bytes(n, d, 1, "zero") == zero_memory_formula(n, d, 1)  # 4 + 12/d
    assert model_state_bytes(n, d, 1, "megatron") == pytest.approx(n * (6 + 12 / d))
    assert model_state_bytes(n, d, 0, "megatron") == 18 * n
    assert model_state_bytes(n, d, 2, "deepspeed") > zero_memory_formula(n, d, 2)  # buckets
    assert model_state_bytes(n, d, 2, "fsdp") == pytest.approx(n * (4 + 16 / d))
    with pytest.raises(ValueError, match=r"megatron accounting has ZeRO stages \(0, 1\), not 2"):
        model_state_bytes(n, d, 2, "megatron")


def test_the_dp_reduction_overlaps_the_last_backward():
    model = get_model("7b")
    cluster = cluster_of("h100", nodes=4, terms=BEST_CASE)
    p = evaluate(model, cluster, Layout(1, 1, 32, zero=1, micro_batch=1), 512)
    n = p.memory.params_per_gpu  # Megatron: fp32 gradients reduce-scattered, bf16 gathered
    buckets = -(-int(n) // 40_000_000)  # max(40M, 1M x 32) parameters a bucket
    reduce, reduce_last = bucketed_seconds(4 * n, buckets, 32, 1, cluster, all_reduce=False)
    gather, gather_last = bucketed_seconds(2 * n, buckets, 32, 1, cluster, all_reduce=False)
    stage = p.time.stage_s
    assert p.time.dp_s == pytest.approx(max(reduce_last, reduce - 2 * stage / 3)
                                        + max(gather_last, gather - stage / 3))
    assert 0 < p.time.dp_s < reduce + gather


def test_deepspeed_zero2_reduces_every_micro_step_the_paper_once_per_step():
    n = 1e9
    paper, deepspeed = gradient_traffic(n, 2, "zero"), gradient_traffic(n, 2, "deepspeed")
    assert paper.reduce_per_step == 2 * n and paper.per_microstep == 0
    assert deepspeed.per_microstep == 2 * n and deepspeed.reduce_per_step == 0
    # overlapped with each micro-step's compute: exposed only where it outlasts it
    model, cluster = get_model("7b"), cluster_of("a100", nodes=4, terms=BEST_CASE)
    p = evaluate(model, cluster, Layout(1, 1, 32, zero=2, accounting="deepspeed"), 2048)
    buckets = 14  # 6.7B parameters in DeepSpeed's buckets of 5e8
    total, last = bucketed_seconds(2 * p.memory.params_per_gpu, buckets, 32, 1, cluster, False)
    stage, m = p.time.stage_s, p.microbatches
    assert p.time.dp_s == pytest.approx(m * max(0, total - stage) + max(last, total - stage / 3))


def test_the_slowest_stage_paces_the_pipeline():
    # 80 layers on 16 stages: 5 each, and the last also runs the LM head
    assert slowest_stage(80, 16, layer_s=1.0, head_s=1.1) == (5, True)
    # 126 layers on 16 (Llama 3 405B): stages of 8, the last can take 6 and the head
    assert slowest_stage(126, 16, layer_s=1.0, head_s=1.0) == (8, False)
    assert slowest_stage(80, 1, layer_s=1.0, head_s=1.0) == (80, True)
    p = evaluate(MODEL, H100, Layout(1, 16, 2, cp=4, v=5), 1024)
    t = p.time
    layer = t.layer_s + t.tp_exposed_s + t.cp_exposed_s
    assert t.stage_s == pytest.approx(5 * layer + t.head_s)
    assert t.stage_s > (80 * layer + t.head_s) / 16 * 1.15, "not the average stage"


def test_the_step_adds_up_by_cause():
    for layout in (Layout(2, 8, 4, cp=2, v=10), Layout(8, 1, 16, zero=3, micro_batch=8,
                                                       recompute="full", accounting="fsdp")):
        p = evaluate(MODEL, H100, layout, 1024)
        terms = p.time.breakdown()
        assert sum(terms.values()) == pytest.approx(p.step_s)
        assert terms["layers"] == pytest.approx(p.microbatches * p.time.stage_layers * p.time.layer_s)


def test_each_model_chunk_reduces_its_gradients_when_its_last_backward_ends():
    assert exposed_seconds(3.0, v=1, pp=4, pass_s=1.0) == pytest.approx(2.0)  # max(0, 3 - 1)
    assert exposed_seconds(0.5, v=1, pp=4, pass_s=1.0) == 0.0
    # v = 2: half is ready (1 x 4 + 1) / 2 = 2.5 passes before the end, half 0.5 before it
    assert exposed_seconds(3.0, v=2, pp=4, pass_s=1.0) == pytest.approx(1.0)
    plain = evaluate(MODEL, H100, Layout(4, 4, 8), 1024)
    interleaved = evaluate(MODEL, H100, Layout(4, 4, 8, v=20), 1024)
    assert interleaved.time.dp_s < plain.time.dp_s


def test_full_recomputation_with_sp_keeps_the_input_shard():
    s, b, h, a, t = 4096, 2, 8192, 64, 8
    assert activation_bytes_with_recompute(s, b, h, a, t, True, "full") == 2 * s * b * h / t
    assert activation_bytes_with_recompute(s, b, h, a, t, False, "full") == 2 * s * b * h
    p = evaluate(MODEL, H100, Layout(8, 1, 16, zero=3, micro_batch=8, recompute="full",
                                     accounting="fsdp"), 1024)
    assert p.memory.activation_per_layer_bytes == 2 * s * 8 * h / t
    assert p.fits


def test_tp_comm_overlap_is_priced_as_it_runs_and_its_bound_is_the_best_case():
    exposed = evaluate(MODEL, H100, Layout(4, 4, 8, v=20), 1024)
    overlapped = evaluate(MODEL, H100, Layout(4, 4, 8, v=20, tp_comm_overlap=True), 1024)
    comm, gemms = exposed.time.tp_comm_s, H100.gpu.layer.layer_gemm_seconds(MODEL, 4, 1) / 0.9
    assert overlapped.time.tp_comm_s == comm == exposed.time.tp_exposed_s > 0
    # one chunk in tp exposed, and the GEMMs slowed by the transfers' SMs meanwhile
    assert overlapped.time.tp_exposed_s == pytest.approx(comm / 4 + 20 / 132 * comm * 3 / 4)
    bound = evaluate(MODEL, cluster_of("h100", 16, terms=BEST_CASE),
                     Layout(4, 4, 8, v=20, tp_comm_overlap=True), 1024)
    assert bound.time.tp_exposed_s == max(0.0, comm - gemms) == 0.0
    assert bound.step_s < overlapped.step_s < exposed.step_s


def test_context_parallelism_is_an_axis():
    model = get_model("405b")
    p = evaluate(model, cluster_of("h100", nodes=64), Layout(8, 8, 4, cp=2), 256)
    assert p.layout.gpus == 512
    assert p.memory.activation_per_layer_bytes == pytest.approx(
        evaluate(model, cluster_of("h100", nodes=32), Layout(8, 8, 4), 256)
        .memory.activation_per_layer_bytes / 2, rel=0.01)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=8, pp=4, dp=2), r"tp 8 x cp 1 x pp 4 x dp 2 = 64, but the cluster has 16 nodes x 8 = 128"),
    (dict(tp=16, pp=1, dp=8), r"tp 16 is larger than a node \(8 GPUs\)"),
    (dict(tp=8, pp=0, dp=16), r"pp must be a positive integer, got 0"),
    (dict(tp=8, pp=4, dp=4, v=3), r"interleaving needs equal chunks: 80 layers are not "
                                  r"divisible by pp\*v = 4\*3 = 12"),
    (dict(tp=8, pp=1, dp=16, v=2), r"v 2 virtual stages need pp > 1"),
    (dict(tp=8, pp=4, dp=2, cp=2, attention="explicit"),
     r"context parallelism needs fused attention: cp 2 with explicit attention"),
])
def test_bad_layouts_name_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        evaluate(MODEL, H100, Layout(**kwargs), global_batch=1024)


def test_bad_inputs_name_the_numbers():
    with pytest.raises(ValueError, match=r"unknown preset '80b'"):
        get_model("80b")
    with pytest.raises(ValueError, match=r"nodes must be a positive number, got -2"):
        cluster_of("h100", nodes=-2)
    with pytest.raises(ValueError, match=r"global batch 1000 is not divisible by dp 16"):
        evaluate(MODEL, H100, Layout(8, 1, 16), global_batch=1000)
    with pytest.raises(ValueError, match="no layout of 405b"):
        plan(get_model("405b"), cluster_of("h100", nodes=1), global_batch=64)


def test_explain_shows_the_math_and_the_runner_up():
    best, runner_up = recommend(MODEL, H100, 1024)
    assert best.key() != runner_up.key(), "the runner-up splits the model another way"
    text = explain(best) + why(best, runner_up)
    for needle in ("N = 70.55B parameters", "activation_bytes", "makespan_formula", "framework",
                   "MFU", "runner-up", "slowest stage", "by cause", "why: the runner-up"):
        assert needle in text


def test_cli_prints_a_ranked_table_and_the_explanation(capsys):
    main(["--preset", "70b", "--nodes", "16", "--gpus-per-node", "8", "--top", "3",
          "--explain"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "layouts fit; the 3 fastest" in lines[0]
    steps = [float(line.split()[-2]) for line in lines[2:5]]
    assert steps == sorted(steps)
    assert "memory per GPU" in out and "time per step" in out and "runner-up" in out
    for needle in ("NeMo Llama 2 70B", "NeMo Llama 3 70B", "torchtitan 70B", "TP overlap",
                   "--tp-comm-overlap", "global batch: the pick", "trust:"):
        assert needle in out


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
