"""The planner's memory against reported peaks (reported_memory.py cites each): every predicted
row within 10% of the reported peak of the counter its source reports, every run that trained
predicted to fit; the terms it adds, one by one; the GPU variants."""
import pytest

from reference_impl.perf.planner.cli import main
from reference_impl.perf.planner.framework_memory import fsdp_unsharded_bytes, model_state_bytes
from reference_impl.perf.planner.hardware import (GPU_VARIANTS, GPUS, GiB, cluster_of,
                                                  gpu_with_memory, outside_allocator_bytes)
from reference_impl.perf.planner.layer_activations import activation_bytes, op_sac_bytes
from reference_impl.perf.planner.layout import Layout
from reference_impl.perf.planner.memory_estimate import FRAGMENTATION
from reference_impl.perf.planner.plans import evaluate
from reference_impl.perf.planner.reported_memory import LLAMA31_8B, REPORTED_PEAKS, RESERVED
from reference_impl.perf.planner.validation import MEMORY_TOLERANCE, compare, compare_memory

MEMORY = compare_memory()
TRAINED = [c for c in compare() if c.plan is not None]


@pytest.mark.parametrize("comparison", MEMORY, ids=lambda c: c.run.name)
def test_each_reported_peak_is_within_tolerance_or_says_why_not(comparison):
    if comparison.plan is None:
        assert comparison.run.not_predicted
        return
    assert abs(comparison.ratio - 1) <= MEMORY_TOLERANCE, comparison.row()
    assert comparison.plan.fits, comparison.row()  # it trained


@pytest.mark.parametrize("comparison", TRAINED, ids=lambda c: c.run.name)
def test_published_layouts_that_trained_fit(comparison):
    assert comparison.plan.fits, comparison.row()


def test_the_table_names_its_counter_and_the_8b_run_is_there():
    assert all(run.counter == RESERVED for run in REPORTED_PEAKS)
    run = next(r for r in REPORTED_PEAKS if r.name == "Llama 3.1 8B FSDP")
    assert (run.reported_gib, run.gpus, run.micro_batch, run.recompute) == (82.4, 8, 2,
                                                                            "selective")
    assert sum(c.plan is not None for c in MEMORY) >= 10


def test_op_sac_keeps_every_other_matmul_the_attention_output_and_the_input():
    s, b, e = 8192, 2, 2
    h, k, f = 4096, 1024, 14336
    kept = op_sac_bytes(LLAMA31_8B, s, b)
    assert kept == e * s * b * (h + (h + k + f + h) + h) + 4 * 32 * s * b
    assert kept < activation_bytes(LLAMA31_8B, s, b, recompute="selective") / 2


def test_fsdp_working_set_is_two_gathered_layers_one_gradient_and_the_root():
    layer, root, n, d = 2e8, 1e9, 8e9, 8
    assert fsdp_unsharded_bytes(layer) == 10 * layer
    assert model_state_bytes(n, d, 3, "fsdp", layer, root) == 16 * n / d + 10 * layer + 2 * root


def test_torchtitan_loss_is_three_fp32_copies_and_a_stranded_bf16_block():
    cluster = cluster_of("h100-sxm-96gb", 1)
    fsdp = evaluate(LLAMA31_8B, cluster, Layout(1, 1, 8, 3, 2, "selective",
                                                accounting="fsdp"), 16).memory
    elements = 8192 * 2 * 128256
    assert fsdp.logits_bytes == 12 * elements and fsdp.allocator_bytes == 2 * elements
    assert fsdp.total_bytes - fsdp.allocated_bytes == pytest.approx(
        2 * elements + FRAGMENTATION * fsdp.activation_bytes)
    megatron = evaluate(LLAMA31_8B, cluster, Layout(1, 1, 8, 1, 2, "selective"), 16).memory
    assert megatron.logits_bytes == 4 * elements and megatron.allocator_bytes == 0


def test_the_loss_and_a_rebuilt_layer_do_not_add():
    memory = evaluate(LLAMA31_8B, cluster_of("h100", 1), Layout(1, 1, 8, 3, 1, "full",
                                                                accounting="fsdp"), 8).memory
    assert memory.rebuilt_bytes > 0
    assert memory.total_bytes == pytest.approx(
        memory.model_state_bytes + memory.activation_bytes + memory.fragmentation_bytes
        + max(memory.logits_bytes + memory.allocator_bytes, memory.rebuilt_bytes))


def test_usable_memory_is_the_gpu_less_the_context_and_nccl():
    cluster = cluster_of("h100", 1)
    assert cluster.usable_bytes == 80 * GiB - outside_allocator_bytes()


def test_variants_carry_their_data_sheet_figures_and_keep_their_type():
    expected = {"h100-sxm-80gb": (80, 3.35e12, 700), "h100-sxm-96gb": (96, 2.4e12, 500),
                "a100-40gb": (40, 1.555e12, 400), "a100-80gb": (80, 2.039e12, 400),
                "h200-141gb": (141, 4.8e12, 700)}
    for key, (memory, bandwidth, power) in expected.items():
        gpu = GPU_VARIANTS[key]
        assert (gpu.memory_gib, gpu.power_w) == (memory, power) and gpu.source
        assert gpu.layer.memory_bandwidth == pytest.approx(bandwidth)
    assert cluster_of("a100-40gb", 1).intra_bw_gbs == cluster_of("a100", 1).intra_bw_gbs
    assert gpu_with_memory("h100-sxm-96gb", 95).layer.memory_bandwidth == pytest.approx(2.4e12)


def test_device_names_still_find_their_type():
    # benchmarks/mfu.py's lookup: the first GPUS key in the lower-cased device name
    def lookup(name):
        return next((gpu for key, gpu in GPUS.items() if key in name.lower()), None)
    assert lookup("NVIDIA H100 80GB HBM3") is GPUS["h100"]
    assert lookup("NVIDIA H200") is GPUS["h200"]
    assert lookup("NVIDIA A100-SXM4-40GB") is GPUS["a100"]


def test_validate_prints_memory_ratios(capsys):
    main(["--validate"])
    out = capsys.readouterr().out
    assert "Llama 3.1 8B FSDP" in out and "max_memory_reserved" in out and "ratio" in out
