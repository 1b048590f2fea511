"""Context parallelism's single-process parts: the online-softmax merge and the block attention's
backward against one softmax over the whole sequence, the load-balanced layout, the cost
formulas' arithmetic, and the errors for bad sizes. No ranks are launched.

Tolerance (fp32): atol = rtol = 1e-5. Measured on CPU: within 1e-6 (the merge rescales
partial sums that one softmax adds in another order).
"""
import pytest
import torch

from reference_impl.checks import assert_close
from reference_impl.model.llama_blocks import GroupedQueryAttention
from reference_impl.cp.cp_costs import (allgather_attention_bytes, attention_activation_bytes,
                                        kv_block_bytes, ring_attention_bytes)
from reference_impl.cp.load_balance import (shard_sequence, token_positions, unshard_sequence,
                                            visible_part)
from reference_impl.cp.online_softmax import (block_attention, block_attention_backward,
                                              merge_partials, output_dot_grad, visible_keys)
from reference_impl.cp.ring_attention import ring_attention
from reference_impl.model import causal_attention, repeat_kv_heads
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
BATCH, HEADS, SEQ, DIM = 2, 4, 12, 8


def qkv(kv_heads, seq=SEQ):
    return (random((BATCH, HEADS, seq, DIM), seed=1), random((BATCH, kv_heads, seq, DIM), seed=2),
            random((BATCH, kv_heads, seq, DIM), seed=3))


def one_device(q, k, v):
    return causal_attention(q, repeat_kv_heads(k, HEADS), repeat_kv_heads(v, HEADS))


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_merging_two_blocks_of_keys_is_one_softmax_over_all(kv_heads):
    q, k, v = qkv(kv_heads)
    positions = torch.arange(SEQ)
    whole_out, whole_lse = block_attention(q, k, v, positions, positions)
    assert_close(whole_out, one_device(q, k, v), "one block's output", **TOLERANCE)
    # the keys in two halves, merged in either order; the first rows see no key of the second
    # half (lse -inf, out 0) and must come out of the merge without NaN
    halves = [block_attention(q, k[:, :, part], v[:, :, part], positions, positions[part])
              for part in (slice(0, SEQ // 2), slice(SEQ // 2, SEQ))]
    second_out, second_lse = halves[1]
    assert torch.isneginf(second_lse[..., :SEQ // 2]).all() and (second_out[..., :SEQ // 2, :] == 0).all()
    for first, second in (halves, halves[::-1]):
        out, lse = merge_partials(*first, *second)
        assert not out.isnan().any(), "the merge made NaN of rows that see no key of a block"
        assert_close(out, whole_out, "merged output", **TOLERANCE)
        assert_close(lse, whole_lse, "merged log-sum-exp", **TOLERANCE)
    # a row that sees no key at all stays (0, -inf)
    hidden = block_attention(q, k, v, positions, positions + SEQ)
    out, lse = merge_partials(*hidden, *hidden)
    assert (out == 0).all() and torch.isneginf(lse).all()
    # a full block (no positions) is the unmasked softmax
    full_out, _ = block_attention(q, k, v)
    scores = q @ repeat_kv_heads(k, HEADS).transpose(-2, -1) / DIM ** 0.5
    assert_close(full_out, scores.softmax(-1) @ repeat_kv_heads(v, HEADS), "full block", **TOLERANCE)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_block_backward_from_the_final_lse_is_the_softmax_gradient(kv_heads):
    q, k, v = (t.requires_grad_() for t in qkv(kv_heads))
    upstream = random((BATCH, HEADS, SEQ, DIM), seed=4)
    one_device(q, k, v).backward(upstream)
    positions = torch.arange(SEQ)
    with torch.no_grad():
        out, lse = block_attention(q, k, v, positions, positions)
        grads = [0, 0, 0]
        for part in (slice(0, 5), slice(5, SEQ)):  # two uneven blocks of keys, summed
            block = block_attention_backward(q, k[:, :, part], v[:, :, part], upstream, lse,
                                             output_dot_grad(out, upstream), positions, positions[part])
            grads[0] = grads[0] + block[0]
            grads[1:] = [torch.cat((g, b), dim=2) if part.start else b for g, b in zip(grads[1:], block[1:])]
    for what, grad, tensor in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert_close(grad, tensor.grad, what, **TOLERANCE)


def test_load_balanced_layout():
    assert token_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert token_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    x = torch.arange(2 * 24 * 3).view(2, 24, 3)
    for cp in (1, 2, 3, 4):
        shards = [shard_sequence(x, cp, rank) for rank in range(cp)]
        assert torch.equal(unshard_sequence(shards), x), f"cp {cp}: shard then unshard"
        for rank, shard in enumerate(shards):
            assert torch.equal(shard[0, :, 0] // 3, token_positions(24, cp, rank)), f"cp {cp} rank {rank}"
        # the point of the layout: every rank has the same number of visible (query, key) pairs
        work = {int((token_positions(24, cp, rank)[:, None] + 1).sum()) for rank in range(cp)}
        assert len(work) == 1, f"cp {cp}: unequal causal work per rank {work}"
        # the part of each block the ring computes is exactly where the causal mask sees keys
        for rank in range(cp):
            for owner in range(cp):
                visible = visible_keys(token_positions(24, cp, rank), token_positions(24, cp, owner))
                rows, keys, masked = visible_part(cp, rank, owner, 24 // cp)
                outside = visible.clone()
                outside[rows, keys] = False
                assert not outside.any(), f"cp {cp}, rank {rank}, owner {owner}: visible keys left out"
                assert masked == (owner == rank) and (masked or visible[rows, keys].all()), (cp, rank, owner)


def test_cost_formulas():
    block = kv_block_bytes(2, 2, 16, 8, 4)
    assert block == 2 * 2 * 2 * 4 * 8 * 4
    assert ring_attention_bytes(2, 2, 16, 8, 4) == {"forward": 3 * block, "backward": 6 * block}
    assert allgather_attention_bytes(2, 2, 16, 8, 4) == {"forward": 3 * block, "backward": 3 * block}
    bf16 = ring_attention_bytes(2, 2, 16, 8, 4, element_bytes=2)
    assert bf16 == {"forward": 3 * block // 2, "backward": 3 * block // 2 * 3}  # dK/dV in fp32
    assert ring_attention_bytes(2, 2, 16, 8, 1) == {"forward": 0, "backward": 0}
    one = attention_activation_bytes(2, 4, 2, 16, 8, 1)
    assert one == attention_activation_bytes(2, 4, 2, 16, 8, 1, variant="allgather")
    assert attention_activation_bytes(2, 4, 2, 16, 8, 4) * 4 == one
    assert attention_activation_bytes(2, 4, 2, 16, 8, 4, variant="allgather") > one // 4


def test_errors_name_the_constraint_and_the_numbers():
    with pytest.raises(ValueError, match=r"2\*cp = 8 chunks: seq 12 is not divisible by 8"):
        shard_sequence(torch.zeros(1, 12, 4), 4, 0)
    with pytest.raises(ValueError, match="seq 12 is not divisible by 8"):
        token_positions(12, 4, 1)
    with pytest.raises(ValueError, match="seq 20 is not divisible by 8"):
        ring_attention_bytes(1, 1, 20, 8, 4)
    with pytest.raises(ValueError, match="kv_heads 3 does not divide heads 8"):
        GroupedQueryAttention(32, 8, kv_heads=3)
    q, k, v = random((1, 4, 6, 8), 0), random((1, 3, 6, 8), 1), random((1, 3, 6, 8), 2)
    with pytest.raises(ValueError, match="kv_heads 3 does not divide heads 4"):
        ring_attention(q, k, v)
    with pytest.raises(ValueError, match="this rank's seq 5 is odd"):
        ring_attention(q[:, :, :5], k[:, :2, :5], v[:, :2, :5])
    with pytest.raises(ValueError, match="variant must be one of 'ring', 'allgather', got 'tree'"):
        attention_activation_bytes(1, 4, 2, 8, 8, 2, variant="tree")
