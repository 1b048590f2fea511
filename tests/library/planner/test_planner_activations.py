"""Activation bytes per layer from the layer's real shapes (MLP width, gating, KV heads):
Korthikanti et al.'s count for a GPT layer, and what autograd saves in a Llama-style layer on
the CPU, byte for byte."""
import pytest

from reference_impl.perf.capacity import activation_bytes_with_recompute
from reference_impl.perf.planner.layer_activations import activation_bytes, measured_layer_bytes
from reference_impl.perf.planner.model_spec import ModelSpec

LLAMA = ModelSpec("llama", 1, 64, 8, 100, 32, kv_heads=2, ffn_hidden=160, gated_mlp=True)
GPT = ModelSpec("gpt", 1, 64, 4, 100, 16, dropout=True)


@pytest.mark.parametrize("model", [LLAMA, ModelSpec("gpt", 1, 64, 4, 100, 16),
                                   ModelSpec("mha", 1, 64, 4, 100, 16, ffn_hidden=96,
                                             gated_mlp=True)],
                         ids=lambda m: m.name)
@pytest.mark.parametrize("t", [1, 2])
def test_the_count_is_what_autograd_saves(model, t):
    s, b = model.seq_len, 2
    norm_statistics = 2 * 4 * s * b  # two RMSNorms' fp32 1/rms per token, left out by the count
    counted = activation_bytes(model, s, b, t, bytes_per_element=4)
    assert measured_layer_bytes(model, s, b, t) == counted + norm_statistics


@pytest.mark.parametrize("sp, recompute, attention", [
    (False, None, "explicit"), (True, None, "explicit"), (True, "selective", "explicit"),
    (True, None, "flash"), (False, "full", "flash"), (True, "full", "flash")])
def test_a_gpt_layer_is_korthikantis_table(sp, recompute, attention):
    s, b, t = 16, 2, 2
    assert activation_bytes(GPT, s, b, t, sp, recompute, attention) == activation_bytes_with_recompute(
        s, b, GPT.hidden, GPT.heads, t, sp, recompute, flash=attention == "flash")


def test_kv_heads_and_a_gated_mlp_move_the_count():
    plain = ModelSpec("p", 1, 64, 8, 100, 32, ffn_hidden=160)
    gqa = ModelSpec("g", 1, 64, 8, 100, 32, kv_heads=2, ffn_hidden=160)
    gated = ModelSpec("s", 1, 64, 8, 100, 32, ffn_hidden=160, gated_mlp=True)
    s, b, e = 32, 1, 2
    base = activation_bytes(plain, s, b)
    assert base - activation_bytes(gqa, s, b) == e * s * b * 2 * (64 - 16)  # K and V narrower
    assert activation_bytes(gated, s, b) - base == e * s * b * 160  # SwiGLU's input is 2f wide
