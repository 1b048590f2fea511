"""Activation bytes of one transformer layer from its real shapes: the MLP's width, a gated MLP,
and the key/value heads, on one rank of a TP group.

Korthikanti et al. 2022, Table 2 (sbh (34 + 5as/h) for a GPT layer), tensor by tensor with the
shapes kept apart; :func:`op_sac_bytes` for torchtitan's op-level selective checkpointing;
:func:`measured_layer_bytes` checks the count against what autograd saves. The table:
docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_impl.memory.activation_memory import SavedActivations
from reference_impl.memory.recompute import MODES
from reference_impl.model import check_attention
from reference_impl.perf.planner.model_spec import ModelSpec


def activation_bytes(model: ModelSpec, s: int, b: int, t: int = 1,
                     sequence_parallel: bool = False, recompute: str | None = None,
                     attention: str = "flash", bytes_per_element: int = 2) -> float:
    """Bytes one TP rank keeps for one layer's backward (docs/library.md): ``s`` tokens of
    each of ``b`` sequences on this rank (s / cp under context parallelism)."""
    if recompute not in MODES:
        raise ValueError(f"recompute must be one of {MODES}, got {recompute!r}")
    e, m, h = bytes_per_element, (1 if model.dropout else 0), model.hidden
    sb = s * b
    if recompute == "full":
        return e * sb * h / t if sequence_parallel else e * sb * h
    replicated = (4 * e + 2 * m) * sb * h
    if sequence_parallel:
        replicated /= t
    up = (2 if model.gated_mlp else 1) * model.active_ffn  # with experts: top_k experts'
    split = e * sb * (h + 2 * model.kv_dim + h + up + model.active_ffn)
    total = replicated + split / t
    if recompute is None:
        if check_attention(_kernel(attention)) == "explicit":
            total += (2 * e + m) * model.heads * s * s * b / t
        else:
            total += 4 * model.heads * s * b / t
    return total


def op_sac_bytes(model: ModelSpec, s: int, b: int, t: int = 1,
                 sequence_parallel: bool = False, bytes_per_element: int = 2) -> float:
    """Bytes one TP rank keeps for one layer under torchtitan's op-level selective
    checkpointing (docs/library.md): of the matmuls in order (Q, K, V, the projection, then
    the gate, up and down matmuls of a gated MLP, or fc1 and fc2), the 1st, 3rd, ... outputs
    (h, k, f, h wide in a Llama layer), the attention output (h) and its log-sum-exp, and the
    layer's input (a shard with SP)."""
    e, h, k, f, sb = bytes_per_element, model.hidden, model.kv_dim, model.active_ffn, s * b
    widths = [h, k, k, h] + ([f, f, h] if model.gated_mlp else [f, h])
    layer_input = e * sb * h / (t if sequence_parallel else 1)
    saved_matmuls = e * sb * sum(widths[::2]) / t
    attention = (e * sb * h + 4 * model.heads * s * b) / t
    return layer_input + saved_matmuls + attention


def _kernel(attention: str) -> str:
    """The planner's name of an attention kernel ("flash") as the model's ("sdpa")."""
    return "sdpa" if attention == "flash" else attention


class FusedSwiGLU(torch.autograd.Function):
    """SiLU(gate) * value as one function that saves only its input and recomputes SiLU in
    the backward, as Megatron-LM's fused bias-SwiGLU does."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        gate, value = x.chunk(2, -1)
        return F.silu(gate) * value

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        gate, value = x.chunk(2, -1)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        return torch.cat([grad * value * sig * (1 + gate * (1 - sig)), grad * silu], -1)


def measured_layer_bytes(model: ModelSpec, s: int, b: int, t: int = 1) -> int:
    """Bytes autograd saves in one forward of a Llama-style layer (RMSNorm, fused QKV with
    grouped-query flash attention, projection, RMSNorm, gated or plain MLP) at the shapes one
    rank of a TP group of ``t`` holds, fp32 on the CPU, parameters excluded."""
    h, head_dim = model.hidden, model.hidden // model.heads
    heads, kv_heads = model.heads // t, (model.kv_heads or model.heads) // t
    up_width = (2 if model.gated_mlp else 1) * model.ffn // t
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(k, n, generator=generator, requires_grad=True) for k, n in
               ((h, (heads + 2 * kv_heads) * head_dim), (heads * head_dim, h), (h, up_width),
                (model.ffn // t, h))]
    qkv, proj, up, down = weights
    x = torch.randn(b, s, h, generator=generator, requires_grad=True)
    with SavedActivations(weights) as saved:
        y = F.rms_norm(x, (h,)) @ qkv
        q, k, v = (part.unflatten(-1, (-1, head_dim)).transpose(1, 2) for part in
                   y.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=kv_heads != heads)
        x1 = x + out.transpose(1, 2).flatten(2) @ proj
        hidden = F.rms_norm(x1, (h,)) @ up
        act = FusedSwiGLU.apply(hidden) if model.gated_mlp else F.gelu(hidden)
        x1 + act @ down
    return saved.total
