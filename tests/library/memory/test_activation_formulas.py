"""This model's activation count (``memory/activation_memory.py``) for both attention kernels
and both precisions, against the bytes autograd saves (saved-tensor hooks), to the byte.

``model_activation_bytes`` per block and ``gpt_activation_bytes`` for the whole GPT (blocks,
embeddings, head and loss): explicit attention keeps the s x s softmax (in bf16 its fp32
output and the bf16 copy the @ v matmul keeps), sdpa one fp32 log-sum-exp per row instead. In
bf16 the measured bytes also hold autocast's bf16 weight copies, which
``precision.weight_copy_bytes`` counts. Korthikanti et al.'s formula drops its 5as/h term for
the fused kernel.
"""
import pytest
import torch

from reference_impl.memory.activation_memory import (SavedActivations, gpt_activation_bytes,
                                                     model_activation_bytes)
from reference_impl.model import GPT, Block, ModelConfig
from reference_impl.perf.capacity import activation_bytes_with_recompute
from reference_impl.pipeline.pipeline_executor import gpt_loss
from reference_impl.model.precision import autocast, weight_copy_bytes

S, B, H, A, V = 16, 3, 32, 4, 50
COMBINATIONS = [(attention, precision) for attention in ("explicit", "sdpa")
                for precision in ("fp32", "bf16")]


@pytest.mark.parametrize("attention, precision", COMBINATIONS)
def test_counts_equal_the_saved_bytes(attention, precision):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=V, seq_len=S, hidden=H, heads=A, layers=2,
                         attention=attention)
    block, gpt = Block(config), GPT(config)
    x = torch.randn(B, S, H, requires_grad=True)
    tokens, targets = torch.randint(V, (B, S)), torch.randint(V, (B, S))
    with SavedActivations(block.parameters()) as saved_block, autocast(precision, "cpu"):
        block(x)
    with SavedActivations(gpt.parameters()) as saved_gpt, autocast(precision, "cpu"):
        gpt_loss(gpt(tokens), targets)
    per_block = model_activation_bytes(S, B, H, A, attention=attention, precision=precision)
    assert saved_block.total - weight_copy_bytes(block, precision) == per_block, (
        f"one block, {attention}, {precision}: saved {saved_block.total} bytes, of which "
        f"{weight_copy_bytes(block, precision)} weight copies; the count is {per_block}")
    whole = gpt_activation_bytes(config, B, precision)
    assert saved_gpt.total - weight_copy_bytes(gpt, precision) == whole, (
        f"the GPT, {attention}, {precision}: saved {saved_gpt.total} bytes, of which "
        f"{weight_copy_bytes(gpt, precision)} weight copies; the count is {whole}")


def test_the_fused_kernel_drops_the_s_squared_term():
    sbh, asb, as2b = S * B * H, A * S * B, A * S * S * B
    assert model_activation_bytes(S, B, H, A, attention="sdpa", precision="bf16") == (
        36 * sbh + 4 * asb + 16 * S * B)
    assert model_activation_bytes(S, B, H, A, precision="bf16") == (
        36 * sbh + 6 * as2b + S * S + 16 * S * B)
    paper = activation_bytes_with_recompute(S, B, H, A)
    fused = activation_bytes_with_recompute(S, B, H, A, flash=True)
    assert paper - fused == 5 * as2b - 4 * asb  # sbh * 5as/h, for a log-sum-exp per row
    with pytest.raises(ValueError, match="attention must be one of"):
        model_activation_bytes(S, B, H, A, attention="flash")
