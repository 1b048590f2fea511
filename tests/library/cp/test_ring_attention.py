"""Ring attention and the all-gather variant against single-device attention, on 4 CPU ranks:
cp = 4 (the world), cp = 2 (two groups, {0, 1} and {2, 3}, each with its own data) and cp = 1
(four groups of one), with heads 4 and kv_heads 4 or 2; this rank's output, dq, dk, dv
against its tokens' share of one device's ``causal_attention`` on the whole sequence. A
sequence of 24 (chunks of 3 at cp = 4, 6 at cp = 2) and a batch of 3.

Then what they send and keep: each rank's traced bytes (its isends for the ring, the ring
share (cp-1)/cp of its all-gather and reduce-scatter for the other) against ``cp_costs``,
forward and backward, in fp32 and bf16; the bytes saved for the backward against the
activation formula; and the ring's per-step overlap measurement (its values in [0, 1]; no
time is asserted).

Tolerance (fp32): atol = rtol = 1e-5. Measured on CPU: within 2e-6 (blocks merged by the
online softmax add in another order than one softmax).
"""
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.cp.allgather_attention import allgather_attention
from reference_impl.cp.cp_costs import (allgather_attention_bytes, attention_activation_bytes,
                                        ring_attention_bytes)
from reference_impl.cp.load_balance import shard_sequence
from reference_impl.cp.ring_attention import ring_attention
from reference_impl.cp.ring_overlap import RingClock
from reference_impl.model import causal_attention, repeat_kv_heads
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
BATCH, HEADS, SEQ, DIM = 3, 4, 24, 8
WORLD = 4
VARIANTS = {"ring": ring_attention, "allgather": allgather_attention}
COSTS = {"ring": ring_attention_bytes, "allgather": allgather_attention_bytes}


def my_cp_group(cp):
    """This rank's CP group of ``cp`` consecutive ranks (every group created on every rank, in
    the same order; the world itself for cp = WORLD), and the group's index."""
    index = dist.get_rank() // cp
    if cp == WORLD:
        return None, index
    groups = [dist.new_group(list(range(first, first + cp))) for first in range(0, WORLD, cp)]
    return groups[index], index


def full_inputs(kv_heads, seed, dtype=torch.float32):
    shapes = [(BATCH, HEADS, SEQ, DIM), (BATCH, kv_heads, SEQ, DIM), (BATCH, kv_heads, SEQ, DIM),
              (BATCH, HEADS, SEQ, DIM)]
    return [random(shape, seed=seed + i).to(dtype) for i, shape in enumerate(shapes)]


def local_leaves(tensors, cp, rank):
    return [shard_sequence(t, cp, rank, dim=2).clone().requires_grad_() for t in tensors]


def attention_pairs():
    """(what, this rank's result, the one-device reference's share of it) for every case."""
    pairs = []
    for cp in (4, 2, 1):
        group, index = my_cp_group(cp)
        rank = dist.get_rank(group)
        for kv_heads in (4, 2):
            q, k, v, upstream = full_inputs(kv_heads, seed=10 * index + kv_heads)
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            reference = causal_attention(q, repeat_kv_heads(k, HEADS), repeat_kv_heads(v, HEADS))
            reference.backward(upstream)
            expected = [reference.detach(), q.grad, k.grad, v.grad]
            for variant, attention in VARIANTS.items():
                q_r, k_r, v_r = local_leaves((q.detach(), k.detach(), v.detach()), cp, rank)
                out = attention(q_r, k_r, v_r, group)
                out.backward(shard_sequence(upstream, cp, rank, dim=2))
                for what, actual, full in zip(("output", "dq", "dk", "dv"), (out, q_r.grad, k_r.grad,
                                                                           v_r.grad), expected):
                    pairs.append((f"{variant}, cp {cp}, kv_heads {kv_heads}: {what}",
                                  actual.detach().cpu(), shard_sequence(full, cp, rank, dim=2).cpu()))
    return pairs


def test_ring_and_allgather_attention_match_one_device(run_on_ranks):
    results = run_on_ranks(attention_pairs, WORLD)
    assert len(results[0]) == 3 * 2 * 2 * 4
    for rank, pairs in enumerate(results):
        for what, actual, expected in pairs:
            assert_close(actual, expected, what, rank=rank, **TOLERANCE,
                         likely_cause="the ring's blocks (positions of the block's owner), the "
                         "online-softmax merge, or dK/dV not returned to their owner")


def sent_and_saved():
    """Per case: bytes this rank sent forward and backward, bytes saved for the backward, and
    the ring's overlap shares."""
    measured = {}
    for cp in (4, 2):
        group, _ = my_cp_group(cp)
        rank = dist.get_rank(group)
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v, upstream = local_leaves(full_inputs(2, seed=1, dtype=dtype), cp, rank)
            for variant, attention in VARIANTS.items():
                saved = []
                clock = RingClock() if variant == "ring" else None
                with CommTracer() as forward, torch.autograd.graph.saved_tensors_hooks(
                        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t):
                    out = attention(q, k, v, group, clock) if clock else attention(q, k, v, group)
                with CommTracer() as backward:
                    out.backward(upstream.detach())
                measured[cp, str(dtype), variant] = {
                    "forward": sent_bytes(forward, cp), "backward": sent_bytes(backward, cp),
                    "received": sum(c.nbytes for c in forward.calls + backward.calls if c.op == "irecv"),
                    "saved": sum(saved), "shares": clock.hidden_shares() if clock else None,
                    "steps": clock.steps if clock else None}
    return measured


def sent_bytes(trace, cp):
    """What this rank sent: its isends, and (cp-1)/cp of each all-gather's output or each
    reduce-scatter's input, as a ring all-gather or reduce-scatter sends (comm_trace.py)."""
    collectives = trace.total_bytes("all_gather") + trace.total_bytes("reduce_scatter")
    assert collectives % cp == 0
    return trace.total_bytes("isend") + collectives // cp * (cp - 1)


def test_bytes_sent_and_saved_match_the_formulas_and_the_overlap_is_measured(run_on_ranks):
    for rank, measured in enumerate(run_on_ranks(sent_and_saved, WORLD)):
        for (cp, dtype, variant), got in measured.items():
            case = f"rank {rank}, {variant}, cp {cp}, {dtype}"
            size = 2 if "bfloat16" in dtype else 4
            formula = COSTS[variant](BATCH, 2, SEQ, DIM, cp, element_bytes=size)
            assert (got["forward"], got["backward"]) == (formula["forward"], formula["backward"]), (
                f"{case}: sent {got['forward']}, {got['backward']} bytes, formula {formula}")
            if variant == "ring":
                assert got["received"] == got["forward"] + got["backward"], case
                assert len(got["steps"]) == len(got["shares"]) == cp - 1, case
                assert all(0.0 <= share <= 1.0 for share in got["shares"]), (case, got["shares"])
            saved = attention_activation_bytes(BATCH, HEADS, 2, SEQ, DIM, cp, size, variant)
            assert got["saved"] == saved, f"{case}: saved {got['saved']} bytes, formula {saved}"
