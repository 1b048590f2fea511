"""The context-parallel attention layer against the single-device one
(``llama_blocks.GroupedQueryAttention``: GQA
with heads 4 and kv_heads 2, rotary embeddings at positions 0..s-1), on 4 CPU ranks: ring and
all-gather, cp = 4 (the world) and cp = 2 (groups {0, 1} and {2, 3}, each with its own data);
this rank's output and input gradient against its tokens' share, every parameter's gradient
after ``sync_context_parallel_grads``, and every weight after an SGD step; a batch of 3 and a
sequence of 16. Without the sync a gradient is this rank's tokens' part only (shown, so the
comparison could catch a missing sync). Once more in bf16 (autocast) against the fp32 layer.

Tolerances. fp32: atol = rtol = 1e-5; measured on CPU: within 4e-6 (gradients up to ~10).
bf16 against the fp32 layer: atol = 3e-2 * max|reference| per tensor (weights after the step:
3e-2 * the largest change the step made), rtol = 0; measured: within 1.6e-2 of that scale
(bf16 keeps 8 significant bits, 2^-9 = 2e-3 per rounding, and the projections, rotary and
attention round several times).
"""
import copy

import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.model.llama_blocks import GroupedQueryAttention
from reference_impl.cp.cp_attention import (ContextParallelAttention,
                                            sync_context_parallel_grads)
from reference_impl.cp.load_balance import shard_sequence
from reference_impl.model.precision import autocast
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
BF16_TOL = 3e-2  # of each tensor's largest |element| (or of the step's largest change)
BATCH, SEQ, HIDDEN, HEADS, KV_HEADS = 3, 16, 32, 4, 2
WORLD, LR = 4, 0.1
CASES = [(4, "ring", "fp32"), (2, "ring", "fp32"), (4, "allgather", "fp32"), (2, "allgather", "fp32"),
         (2, "ring", "bf16"), (4, "allgather", "bf16")]


def my_cp_group(cp):
    index = dist.get_rank() // cp
    if cp == WORLD:
        return None, index
    groups = [dist.new_group(list(range(first, first + cp))) for first in range(0, WORLD, cp)]
    return groups[index], index


def layer_pairs():
    """Per case: (what, parallel, reference, scale) for the output, the input gradient, every
    parameter gradient and every weight after a step; and the unsynced gradients' check."""
    results = {}
    for cp, variant, precision in CASES:
        group, index = my_cp_group(cp)
        rank = dist.get_rank(group)
        torch.manual_seed(index)  # each CP group its own layer and data
        reference = GroupedQueryAttention(HIDDEN, HEADS, KV_HEADS, bias=True).to(current_device())
        layer = ContextParallelAttention(reference, group, variant)
        x, upstream = random((BATCH, SEQ, HIDDEN), seed=index + 1), random((BATCH, SEQ, HIDDEN), seed=9)
        x = x.requires_grad_()
        y = reference(x)
        y.backward(upstream)
        x_local = shard_sequence(x.detach(), cp, rank).requires_grad_()
        with autocast(precision):
            y_local = layer(x_local)
        y_local.backward(shard_sequence(upstream, cp, rank))
        unsynced = {name: p.grad.clone() for name, p in layer.named_parameters()}
        sync_context_parallel_grads(layer, group)
        pairs = [("output", y_local, shard_sequence(y.detach(), cp, rank), None),
                 ("input grad", x_local.grad, shard_sequence(x.grad, cp, rank), None)]
        parameters = dict(reference.named_parameters())
        partial = []
        for name, parameter in layer.named_parameters():
            pairs.append((f"grad of {name}", parameter.grad, parameters[name].grad, None))
            partial.append(not torch.allclose(unsynced[name], parameters[name].grad, **TOLERANCE))
        before = {name: p.detach().clone() for name, p in reference.named_parameters()}
        for module in (reference, layer):
            torch.optim.SGD(module.parameters(), lr=LR).step()
        for name, parameter in layer.named_parameters():
            change = (parameters[name].detach() - before[name]).abs().max()
            pairs.append((f"{name} after a step", parameter, parameters[name], change))
        results[cp, variant, precision] = ([(what, a.detach().float().cpu(), b.detach().cpu(), scale)
                                            for what, a, b, scale in pairs], all(partial), y_local.dtype)
    return results


def test_context_parallel_attention_matches_the_single_device_layer(run_on_ranks):
    for rank, results in enumerate(run_on_ranks(layer_pairs, WORLD)):
        assert set(results) == set(CASES)
        for (cp, variant, precision), (pairs, unsynced_partial, dtype) in results.items():
            assert dtype == (torch.float32 if precision == "fp32" else torch.bfloat16), (precision, dtype)
            assert unsynced_partial, (f"rank {rank}, {variant} cp {cp}: an unsynced gradient already "
                                      "equals the single-device one: the sync would not be tested")
            assert len(pairs) == 2 + 2 * 8  # output, input grad; q, k, v, proj weight and bias
            for what, parallel, reference, change in pairs:
                case = f"{variant}, cp {cp}, {precision}: {what}"
                if precision == "fp32":
                    assert_close(parallel, reference, case, rank=rank, **TOLERANCE,
                                 likely_cause="the global positions (rotary, causal mask), the "
                                 "load-balanced shards, or the CP gradient sum")
                else:
                    scale = reference.abs().max() if change is None else change
                    assert_close(parallel, reference, case, rank=rank, atol=BF16_TOL * float(scale),
                                 rtol=0, against="the single-device layer in fp32")


def test_the_layer_copies_the_weights_under_the_same_names():
    reference = GroupedQueryAttention(HIDDEN, HEADS, KV_HEADS, bias=True)
    layer = ContextParallelAttention(copy.deepcopy(reference), None, "allgather")
    names = dict(reference.named_parameters())
    assert [name for name, _ in layer.named_parameters()] == list(names)
    for name, parameter in layer.named_parameters():
        assert torch.equal(parameter, names[name]) and parameter is not names[name], name
