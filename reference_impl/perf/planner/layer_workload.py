"""The layer the calibrations time: one transformer layer at the shapes one rank of a TP group
holds, forward + backward, with no communication. ``calibrate`` times it for the
layer-efficiency table, ``calibrate_cluster`` beside an all-reduce.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_impl.perf.planner.model_spec import ModelSpec

# The shape of ``--dry-run``: small enough for a CPU.
TINY = ModelSpec("tiny", 1, 128, 4, 256, 64, kv_heads=2, ffn_hidden=256, gated_mlp=True)


def layer_step(shape: ModelSpec, seq: int, micro_batch: int, tp: int, device, dtype):
    """Weights and input of one TP rank's layer, and a function running forward + backward."""
    h, head_dim = shape.hidden, shape.hidden // shape.heads
    heads, kv_heads = shape.heads // tp, (shape.kv_heads or shape.heads) // tp
    generator = torch.Generator().manual_seed(0)

    def weight(k, n):
        return (torch.randn(k, n, generator=generator) / k ** 0.5).to(device, dtype).requires_grad_()

    qkv = weight(h, (heads + 2 * kv_heads) * head_dim)
    proj = weight(heads * head_dim, h)
    up = weight(h, 2 * shape.ffn // tp)
    down = weight(shape.ffn // tp, h)
    x = torch.randn(micro_batch, seq, h, generator=generator).to(device, dtype).requires_grad_()

    def step():
        y = F.rms_norm(x, (h,)) @ qkv
        q, k, v = y.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        q = q.view(micro_batch, seq, heads, head_dim).transpose(1, 2)
        k = k.view(micro_batch, seq, kv_heads, head_dim).transpose(1, 2)
        v = v.view(micro_batch, seq, kv_heads, head_dim).transpose(1, 2)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                   enable_gqa=kv_heads != heads)
        x1 = x + attention.transpose(1, 2).reshape(micro_batch, seq, -1) @ proj
        gate, value = (F.rms_norm(x1, (h,)) @ up).chunk(2, -1)
        out = x1 + (F.silu(gate) * value) @ down
        out.sum().backward()

    return step
