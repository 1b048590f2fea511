"""Activation recomputation (reference_impl/memory/recompute.py): full and selective recomputation
change no number, only what is kept; what is kept, measured with saved-tensor hooks, is exactly
this model's formula (``model_activation_bytes``), and orders full < selective < none.

Tolerance: recomputation runs the same ops on the same values, so outputs and gradients are
compared for exact equality on one device; the TP block on 2 ranks against the single-device
one uses the course's TP tolerance (atol = rtol = 1e-5, see test_sequence_parallel.py).
"""
import copy

import pytest
import torch
import torch.distributed as dist

from reference_impl.equivalence import assert_equivalent, one_step_pairs
from reference_impl.comm.device import current_device
from reference_impl.model import GPT, Block, ModelConfig
from reference_impl.memory.activation_memory import (
    SavedActivations,
    model_activation_bytes,
    saved_activation_bytes,
)
from reference_impl.perf.capacity import activation_bytes_with_recompute
from reference_impl.memory.recompute import MODES, recompute
from reference_impl.tp.sequence_parallel import SequenceParallelBlock
from reference_impl.tp.tp_attention import ParallelBlock

SHAPES = [(8, 2, 32, 4), (16, 3, 48, 6), (32, 1, 64, 2), (12, 2, 24, 3)]  # (s, b, h, a)


def block_and_input(s, b, h, a, seed=0):
    torch.manual_seed(seed)
    block = Block(ModelConfig(seq_len=s, hidden=h, heads=a)).to(current_device())
    x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed + 1))
    return block, x.to(current_device())


def forward_backward(module, x, seed=2):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y.device))
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    return y.detach(), x.grad, grads


# ------------------------------------------------------------------ same numbers, one device

@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputation_changes_no_number(mode):
    block, x = block_and_input(16, 2, 32, 4)
    expected = forward_backward(copy.deepcopy(block), x)
    recomputed = recompute(copy.deepcopy(block), mode)
    y, x_grad, grads = forward_backward(recomputed, x)
    assert torch.equal(y, expected[0]), "output differs"
    assert torch.equal(x_grad, expected[1]), "input gradient differs"
    assert grads.keys() == expected[2].keys(), "parameter names changed"
    for name, grad in grads.items():
        assert torch.equal(grad, expected[2][name]), f"gradient of {name} differs"


def test_recompute_keeps_names_and_is_reversible():
    block, _ = block_and_input(8, 2, 32, 4)
    names = list(block.state_dict())
    recompute(block, "full")
    assert isinstance(block, Block) and list(block.state_dict()) == names
    assert copy.deepcopy(block).__class__ is block.__class__
    recompute(block, "selective")  # switching modes undoes the previous one
    assert type(block) is Block and type(block.attn).__name__.startswith("Selective")
    recompute(block, None)
    assert type(block) is Block and type(block.attn).__name__ == "CausalSelfAttention"
    with pytest.raises(ValueError, match="recompute mode"):
        recompute(block, "half")


def test_recompute_applies_per_block_in_a_gpt():
    config = ModelConfig(layers=3)
    gpt = GPT(config)
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_len))
    s, b, h, a = config.seq_len, 2, config.hidden, config.heads
    none = saved_activation_bytes(gpt, tokens)
    recompute(gpt, "full")
    full = saved_activation_bytes(gpt, tokens)
    # every block now keeps only its input: 3 blocks' worth of savings, the rest unchanged
    per_block_saving = model_activation_bytes(s, b, h, a) - model_activation_bytes(
        s, b, h, a, recompute="full")
    assert none - full == config.layers * per_block_saving


# --------------------------------------------------------------------- measured = formula

@pytest.mark.parametrize("s,b,h,a", SHAPES)
@pytest.mark.parametrize("mode", MODES)
def test_measured_saved_bytes_equal_the_formula(s, b, h, a, mode):
    block, x = block_and_input(s, b, h, a)
    recompute(block, mode)
    measured = saved_activation_bytes(block, x.requires_grad_())
    assert measured == model_activation_bytes(s, b, h, a, recompute=mode), (
        f"mode {mode}: measured {measured} B, formula {model_activation_bytes(s, b, h, a, recompute=mode)} B")


@pytest.mark.parametrize("s,b,h,a", SHAPES)
def test_full_below_selective_below_none(s, b, h, a):
    block, x = block_and_input(s, b, h, a)
    measured = {mode: saved_activation_bytes(recompute(block, mode), x) for mode in MODES}
    assert measured["full"] < measured["selective"] < measured[None]


def test_attention_score_term_scales_with_s_squared():
    def score_bytes(s):
        block, x = block_and_input(s, 2, 32, 4)
        none = saved_activation_bytes(recompute(block, None), x)
        return none - saved_activation_bytes(recompute(block, "selective"), x)

    assert score_bytes(16) == 4 * score_bytes(8) == 4 * 4 * score_bytes(4)
    assert score_bytes(8) == 4 * 4 * 8 * 8 * 2 + 8 * 8  # fp32 a s^2 b, bool causal mask s^2


def test_counter_counts_each_storage_once_and_skips_parameters():
    weight = torch.nn.Parameter(torch.randn(4, 4))
    x = torch.randn(3, 4, requires_grad=True)
    with SavedActivations([weight]) as saved:
        y = x * 2  # saves nothing (a scalar factor)
        (y @ weight).sum()      # saves y (48 B) and the weight (excluded)
        (y[:, :2] * y[:, 2:]).sum()  # two views of y: the same storage, not counted again
    assert saved.total == 3 * 4 * 4


def test_paper_formula_matches_table_2():
    s, b, h, a, t = 2048, 1, 12288, 96, 8  # GPT-3 175B's layer, the paper's running example
    sbh = s * b * h
    assert activation_bytes_with_recompute(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert activation_bytes_with_recompute(s, b, h, a, t) == sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert activation_bytes_with_recompute(s, b, h, a, t, sequence_parallel=True) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h))
    assert activation_bytes_with_recompute(s, b, h, a, t, True, "selective") == pytest.approx(
        sbh * 34 / t)
    assert activation_bytes_with_recompute(s, b, h, a, t, recompute="selective") == sbh * (10 + 24 / t)
    assert activation_bytes_with_recompute(s, b, h, a, t, recompute="full") == 2 * sbh


# ------------------------------------------------------------------------- TP on 2 ranks

def _tp_on_rank(s, b, h, a):
    """On each rank: TP and SP blocks with each recompute mode against the single-device block
    (output, gradients, one step), and their measured saved bytes."""
    block, x = block_and_input(s, b, h, a)
    t, rank = dist.get_world_size(), dist.get_rank()
    pairs, measured = {}, {}
    for mode in MODES:
        tp = recompute(ParallelBlock(block), mode)
        pairs[mode] = one_step_pairs(block, tp, x)
        measured["tp", mode] = saved_activation_bytes(recompute(ParallelBlock(block), mode),
                                                      x.clone().requires_grad_())
        x_shard = x.chunk(t, dim=1)[rank].clone().requires_grad_()
        measured["sp", mode] = saved_activation_bytes(
            recompute(SequenceParallelBlock(block), mode), x_shard)
    return pairs, measured


def test_tp_block_recomputation_on_2_ranks(run_on_ranks):
    s, b, h, a, t = 8, 2, 32, 4, 2
    results = run_on_ranks(_tp_on_rank, t, s, b, h, a)
    for mode in MODES:
        assert_equivalent([pairs[mode] for pairs, _ in results], atol=1e-5, rtol=1e-5)
    for rank, (_, measured) in enumerate(results):
        for (kind, mode), value in measured.items():
            expected = model_activation_bytes(s, b, h, a, t, sequence_parallel=kind == "sp",
                                              recompute=mode)
            assert value == expected, (f"rank {rank}, {kind.upper()} block, recompute {mode}: "
                                       f"measured {value} B, formula {expected} B")
