"""The Llama-style parts on one device (``model/llama_blocks.py``, ``model/gpt.py``'s options): each against
its formula written out independently, the grouped-query attention with as many KV heads as
heads against the GPT's attention given the same weights, the configuration's rules and
refusals, and why replicated KV weights need their gradients summed over the TP ranks.

Tolerance (fp32): atol 1e-5, rtol 1e-5. Observed on CPU (torch 2.13): within 1e-6 (the
formulas add in another order than the modules).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.model.llama_blocks import RMSNorm, GroupedQueryAttention, SwiGLU
from reference_impl.model import GPT, Block, CausalSelfAttention, ModelConfig, llama_config
from reference_impl.pipeline.pipeline_partition import gpt_layers
from reference_impl.model.rotary import apply_rotary
from reference_impl.perf.planner.hardware import Cluster
from reference_impl.perf.planner.layout import Layout, check_layout, splits_block
from reference_impl.perf.planner.model_spec import PRESETS
from reference_impl.tp.tp_splits import kv_head_layout
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
BATCH, SEQ, HIDDEN = 2, 8, 32


def test_rmsnorm_is_its_formula():
    norm = RMSNorm(HIDDEN)
    with torch.no_grad():
        norm.weight.copy_(random(HIDDEN, seed=1).cpu())
    x = random((BATCH, SEQ, HIDDEN), seed=2, scale=3.0).cpu()
    x64 = x.double()
    expected = x64 / (x64.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), expected, **TOLERANCE)
    # and not a layernorm: the mean is not subtracted
    assert not torch.allclose(norm(x + 1.0), norm(x), **TOLERANCE)


def test_swiglu_is_its_formula_with_gate_rows_first():
    torch.manual_seed(0)
    mlp = SwiGLU(HIDDEN, 48)
    x = random((BATCH, SEQ, HIDDEN), seed=3).cpu()
    gate, up = mlp.gate_up.weight[:48], mlp.gate_up.weight[48:]
    expected = (F.silu(x @ gate.T) * (x @ up.T)) @ mlp.down.weight.T
    torch.testing.assert_close(mlp(x), expected, **TOLERANCE)
    assert mlp.gate_up.bias is None and mlp.down.bias is None  # Llama: no biases


def rotate_as_complex(x, positions, base=10000.0):
    """Rotary embeddings the way Llama's reference code writes them: feature pairs (i, i + d/2)
    as complex numbers, multiplied by exp(i * position * base^(-2i/d))."""
    half = x.shape[-1] // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64),
                       positions.double()[:, None] * theta)
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn
    return torch.cat([z.real, z.imag], dim=-1)


def attention_formula(attention: GroupedQueryAttention, x):
    """The attention written out: query head h uses KV head h // (heads / kv_heads), q and k
    rotated at positions 0..s-1, causal softmax with scale 1/sqrt(d), in float64."""
    w = {name: getattr(attention, name).weight.double() for name in ("q", "k", "v", "proj")}
    heads, kv_heads = attention.heads, attention.kv_heads
    x, seq = x.double(), x.shape[1]
    q = (x @ w["q"].T).view(BATCH, seq, heads, -1).transpose(1, 2)
    k = (x @ w["k"].T).view(BATCH, seq, kv_heads, -1).transpose(1, 2)
    v = (x @ w["v"].T).view(BATCH, seq, kv_heads, -1).transpose(1, 2)
    positions = torch.arange(seq)
    q, k = rotate_as_complex(q, positions), rotate_as_complex(k, positions)
    group = torch.arange(heads) // (heads // kv_heads)
    scores = q @ k[:, group].transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ v[:, group]
    return out.transpose(1, 2).reshape(BATCH, seq, -1) @ w["proj"].T


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
@pytest.mark.parametrize("kernel", ["explicit", "sdpa"])
def test_grouped_query_attention_is_its_formula(kv_heads, kernel):
    torch.manual_seed(0)
    attention = GroupedQueryAttention(HIDDEN, 8, kv_heads, attention=kernel)
    x = random((BATCH, SEQ, HIDDEN), seed=4).cpu()
    torch.testing.assert_close(attention(x).double(), attention_formula(attention, x),
                               **TOLERANCE)


def test_rotary_scores_depend_on_the_relative_position_only():
    """Every token has the same q and the same k: after rotary, q_m . k_n is a function of
    m - n alone (the score matrix is constant along its diagonals), and of nothing else."""
    q, k = random((1, 1, 1, 16), seed=5).cpu(), random((1, 1, 1, 16), seed=6).cpu()
    positions = torch.arange(12)
    scores = (apply_rotary(q.expand(1, 1, 12, 16), positions)
              @ apply_rotary(k.expand(1, 1, 12, 16), positions).transpose(-2, -1))[0, 0]
    for offset in range(-11, 12):
        diagonal = scores.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), **TOLERANCE)
    assert not torch.allclose(scores.diagonal(0)[0], scores.diagonal(1)[0], **TOLERANCE)
    # the same two tokens 5 places apart score the same wherever they are
    shifted = apply_rotary(q.expand(1, 1, 1, 16), torch.tensor([9])) @ apply_rotary(
        k.expand(1, 1, 1, 16), torch.tensor([4])).transpose(-2, -1)
    torch.testing.assert_close(shifted[0, 0, 0, 0], scores[5, 0], **TOLERANCE)


@pytest.mark.parametrize("kernel", ["explicit", "sdpa"])
def test_as_many_kv_heads_as_heads_is_the_gpt_attention(kernel):
    torch.manual_seed(0)
    gpt = CausalSelfAttention(HIDDEN, 4, kernel)
    grouped = GroupedQueryAttention(HIDDEN, 4, kv_heads=4, rotary=False, attention=kernel,
                                    bias=True)
    with torch.no_grad():
        for name, rows in zip("qkv", gpt.qkv.weight.chunk(3)):
            getattr(grouped, name).weight.copy_(rows)
        for name, rows in zip("qkv", gpt.qkv.bias.chunk(3)):
            getattr(grouped, name).bias.copy_(rows)
        grouped.proj.load_state_dict(gpt.proj.state_dict())
    x = random((BATCH, SEQ, HIDDEN), seed=7).cpu()
    torch.testing.assert_close(grouped(x), gpt(x), **TOLERANCE)


def test_llama_config_and_its_gpt():
    config = llama_config(hidden=32, heads=4)
    assert (config.norm, config.mlp, config.positions, config.bias) == (
        "rmsnorm", "swiglu", "rotary", False)
    assert config.kv_heads == 2 and config.ffn_size == 96  # heads // 2; 2/3 * 4 * 32 -> 96
    assert llama_config(hidden=16).ffn_size == 48 and llama_config(hidden=64).ffn_size == 176
    torch.manual_seed(0)
    gpt = GPT(config)
    names = [name for name, _ in gpt.named_parameters()]
    assert gpt.position_embedding is None and not any("position" in name for name in names)
    assert not any(name.endswith(".bias") for name in names)
    block = dict(gpt.blocks[0].named_parameters())
    assert {name: tuple(p.shape) for name, p in block.items()} == {
        "ln1.weight": (32,), "ln2.weight": (32,), "attn.q.weight": (32, 32),
        "attn.k.weight": (16, 32), "attn.v.weight": (16, 32), "attn.proj.weight": (32, 32),
        "mlp.gate_up.weight": (192, 32), "mlp.down.weight": (32, 96)}
    tokens = torch.randint(config.vocab_size, (BATCH, config.seq_len),
                           generator=torch.Generator().manual_seed(8))
    # the pipeline's cut (embedding, blocks, head) computes what the GPT does
    torch.testing.assert_close(torch.nn.Sequential(*gpt_layers(gpt))(tokens), gpt(tokens),
                               atol=0, rtol=0)
    # without a position embedding, the order of the tokens still matters (rotary)
    assert not torch.allclose(gpt(tokens.flip(1))[:, -1], gpt(tokens)[:, 0], **TOLERANCE)


def test_the_gpt_keeps_its_parts_and_names():
    block = Block(ModelConfig())
    assert type(block.ln1) is torch.nn.LayerNorm and type(block.attn) is CausalSelfAttention
    assert [name for name, _ in block.named_parameters()] == [
        "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
        "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
        "mlp.fc2.weight", "mlp.fc2.bias"]


@pytest.mark.parametrize("fields, message", [
    (dict(heads=8, kv_heads=3), "kv_heads 3 does not divide heads 8"),
    (dict(kv_heads=0), "kv_heads must be an integer >= 1 or None, got 0"),
    (dict(norm="batchnorm"), "norm must be one of 'layernorm', 'rmsnorm', got 'batchnorm'"),
    (dict(mlp="relu"), "mlp must be one of 'gelu', 'swiglu'"),
    (dict(positions="alibi"), "positions must be one of 'learned', 'rotary'"),
    (dict(hidden=12, heads=4, positions="rotary"), "hidden 12 / heads 4 must be a whole, even"),
])
def test_bad_configurations_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


@pytest.mark.parametrize("heads, kv_heads, tp, expected", [
    (8, 4, 2, "split"), (8, 4, 4, "split"), (8, 2, 4, "replicated"), (4, 1, 2, "replicated"),
    (6, 3, 2, "kv_heads 3 and tp = 2: the KV heads are split over the tensor-parallel ranks "
              "when tp divides kv_heads, or replicated when kv_heads divides tp"),
    (6, 6, 4, "heads 6 is not divisible by the tensor-parallel size tp = 4"),
])
def test_kv_heads_are_split_replicated_or_refused(heads, kv_heads, tp, expected):
    if expected in ("split", "replicated"):
        assert kv_head_layout(heads, kv_heads, tp) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            kv_head_layout(heads, kv_heads, tp)


def test_the_planner_takes_the_trainers_head_rule_and_prices_split_kv_heads_only():
    """The planner refuses what the trainer refuses, with the same rule, and names replicated
    KV heads (which the trainer runs) as outside what it prices."""
    model, cluster = PRESETS["70b"], Cluster(nodes=2, gpus_per_node=16)
    with pytest.raises(ValueError, match="tp 16 would replicate the 8 key/value heads"):
        check_layout(model, cluster, Layout(tp=16, pp=1, dp=2))
    assert not splits_block(model, 16) and splits_block(model, 8)
    with pytest.raises(ValueError, match="heads 64 is not divisible by the tensor-parallel size "
                                         "tp = 3"):
        check_layout(model, Cluster(nodes=1, gpus_per_node=3), Layout(tp=3, pp=1, dp=1))


@pytest.mark.parametrize("fields, config, message", [
    (dict(tp=2), llama_config(hidden=48, heads=6, kv_heads=3), "kv_heads 3 and tp = 2"),
    (dict(tp=2, recompute="selective"), llama_config(), "recompute selective re-implements"),
    (dict(tp=4), llama_config(ffn_hidden=90),
     "inner size 90 is not divisible by the tensor-parallel size tp = 4"),
])
def test_the_parallel_dimensions_refuse_what_they_cannot_split(fields, config, message):
    with pytest.raises(ValueError, match=message):
        TrainingPlan(**fields).check(config)


def test_replicated_kv_heads_take_a_part_of_their_gradient_from_each_rank():
    """kv_heads 2 over tp 4: ranks 2r and 2r + 1 compute query heads that share KV head r. One
    rank's part of the gradient of k and v (its query heads' outputs alone reach the loss) is
    not the gradient: the parts of the ranks sharing a head sum to it, which is why the TP
    attention's replicated k and v weights go through copy_to_tp (all-reduce backward)."""
    torch.manual_seed(0)
    heads, kv_heads, tp = 8, 2, 4
    attention = GroupedQueryAttention(HIDDEN, heads, kv_heads)
    x, upstream = random((BATCH, SEQ, HIDDEN), seed=9).cpu(), random((BATCH, SEQ, HIDDEN), seed=10).cpu()
    head_dim = HIDDEN // heads

    def gradients(rank=None):
        """k's and v's gradients, from every query head or only rank ``rank``'s."""
        attention.zero_grad()
        mask = torch.ones(heads * head_dim)
        if rank is not None:  # proj sees only this rank's query heads' outputs
            mask = torch.zeros(heads, head_dim)
            mask[rank * heads // tp:(rank + 1) * heads // tp] = 1
            mask = mask.flatten()
        handle = attention.proj.register_forward_pre_hook(lambda _, args: (args[0] * mask,))
        attention(x).backward(upstream)
        handle.remove()
        return torch.cat([attention.k.weight.grad, attention.v.weight.grad])

    whole, parts = gradients(), [gradients(rank) for rank in range(tp)]
    rows = whole.view(2, kv_heads, head_dim, HIDDEN)  # (k or v, KV head, ...)
    for rank, part in enumerate(parts):
        assert not torch.allclose(part, whole, **TOLERANCE), f"rank {rank}'s part is the whole"
        others = part.view_as(rows)[:, [h for h in range(kv_heads) if h != rank // 2]]
        assert others.abs().max() == 0, f"rank {rank} reaches a KV head it does not use"
    torch.testing.assert_close(sum(parts), whole, **TOLERANCE)
