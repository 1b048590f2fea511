"""Where a step's time goes (``perf/step_breakdown.py``): the category rules, the operators'
own times, and a profiled CPU step whose categories and gaps add up to its wall time."""
import time

import pytest
import torch

from reference_impl.perf.step_breakdown import (CATEGORIES, _self_times, breakdown, category,
                                                format_breakdown, profile_steps)


@pytest.mark.parametrize("op, kernel, shapes, expected", [
    ("aten::mm", "nvjet_sm90_tst_128x256", [[8, 16], [16, 32]], "matmuls (layers)"),
    ("aten::mm", "sm90_xmma_gemm", [[8, 16], [16, 1000]], "LM head"),
    ("aten::addmm", "", [[32], [8, 16], [16, 32]], "matmuls (layers)"),
    ("aten::_flash_attention_backward", "flash_bwd_kernel", [], "attention"),
    ("aten::_cudnn_attention_forward", "cudnn_generated_sdpa_sm90", [], "attention"),
    ("aten::_log_softmax_backward_data", "cunn_SoftMaxBackward", [], "loss"),
    ("aten::native_layer_norm_backward", "", [], "norms"),
    ("aten::gelu_backward", "", [], "activations"),
    ("aten::_fused_adamw_", "multi_tensor_apply_kernel", [], "optimizer"),
    ("aten::_foreach_mul_", "", [], "optimizer"),
    ("aten::add", "vectorized_elementwise_kernel", [], "elementwise"),
    ("", "triton_per_fused_native_layer_norm_0", [], "norms"),  # compiled: by kernel name
    ("", "triton_poi_fused_gelu_1", [], "activations"),
    ("", "triton_poi_fused_add_2", [], "elementwise"),
])
def test_category(op, kernel, shapes, expected):
    assert category(op, kernel, shapes, vocab=1000) == expected


def test_without_a_vocabulary_every_gemm_is_a_layer():
    assert category("aten::mm", "", [[8, 1000]], vocab=None) == "matmuls (layers)"


def test_self_times_subtract_children_per_thread():
    ops = [{"name": "outer", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
           {"name": "inner", "ts": 2, "dur": 3, "pid": 1, "tid": 1},
           {"name": "inner2", "ts": 6, "dur": 2, "pid": 1, "tid": 1},
           {"name": "other thread", "ts": 1, "dur": 4, "pid": 1, "tid": 2}]
    own = {op["name"]: t for op, t in _self_times(ops)}
    assert own == {"outer": 5, "inner": 3, "inner2": 2, "other thread": 4}


def test_a_profiled_cpu_step_adds_up_to_its_wall_time():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.LayerNorm(256), torch.nn.Linear(256, 100))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    x, target = torch.randn(32, 64), torch.randint(100, (32,))

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), target).backward()
        optimizer.step()

    step()
    with profile_steps(torch.device("cpu")) as prof:
        began = time.perf_counter()
        step(), step()
        wall = time.perf_counter() - began
    result = breakdown(prof, wall, steps=2, vocab=100)
    assert set(result.seconds) == set(CATEGORIES) | {"gaps"}
    for name in ("matmuls (layers)", "LM head", "loss", "norms", "activations", "optimizer"):
        assert result.seconds[name] > 0, name
    assert sum(result.seconds.values()) == pytest.approx(result.wall_seconds, rel=1e-6) \
        or result.seconds["gaps"] == 0
    table = format_breakdown(result, {"LM head": 6 * 32 * 256 * 100}, 1e12)
    assert "step (wall)" in table and "LM head" in table
