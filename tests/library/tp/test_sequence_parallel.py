"""The sequence-parallel block (Korthikanti et al. 2022) against the single-device block, on tp 2
and 4: the input split along the sequence, the gathered outputs, input gradients, every
parameter gradient after the sequence-parallel sync, and the weights after an SGD step; the
classic bug (no sync of the layernorm gradients) caught; and the collectives counted and weighed
against the TP block's.

Tolerance (fp32): atol = rtol = 1e-5. Measured on CPU: within 1.5e-6 (weight gradients of up
to ~7; the matmuls and the layernorm gradients add in a different order than on one device).
"""
import copy

import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.model import Block, ModelConfig
from reference_impl.tp.sequence_parallel import SequenceParallelBlock, sync_sequence_parallel_grads
from reference_impl.tp.tp_attention import ParallelBlock
from reference_impl.tp.tp_collectives import all_gather_along
from reference_impl.tp.tp_layers import full_state
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
CONFIG = ModelConfig(seq_len=8, hidden=32, heads=4)
BATCH = 2
SHAPE = (BATCH, CONFIG.seq_len, CONFIG.hidden)
ACTIVATION_BYTES = BATCH * CONFIG.seq_len * CONFIG.hidden * 4  # the whole fp32 activation
SEQUENCE_PARALLEL = {"ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn.proj.bias",
                     "mlp.fc2.bias"}
LR = 0.1


def my_shard(tensor):
    return tensor.chunk(dist.get_world_size(), dim=1)[dist.get_rank()]


def run_both(sync: bool):
    """The single-device block on the whole sequence and the SP block on this rank's shard,
    forward and backward; returns (reference, x, sp, x_shard, their outputs)."""
    torch.manual_seed(0)
    block = Block(CONFIG).to(current_device())
    x, upstream = random(SHAPE, seed=1), random(SHAPE, seed=2)
    reference = copy.deepcopy(block)
    x = x.clone().requires_grad_()
    y = reference(x)
    y.backward(upstream)
    sp = SequenceParallelBlock(block)
    x_shard = my_shard(x.detach()).clone().requires_grad_()
    y_shard = sp(x_shard)
    y_shard.backward(my_shard(upstream))
    if sync:
        sync_sequence_parallel_grads(sp)
    return reference, x, sp, x_shard, y, y_shard


def sequence_parallel_pairs():
    reference, x, sp, x_shard, y, y_shard = run_both(sync=True)
    pairs = [("output (gathered along seq)", all_gather_along(y_shard.detach(), 1, None), y),
             ("input grad (gathered along seq)", all_gather_along(x_shard.grad, 1, None), x.grad)]
    parameters = dict(reference.named_parameters())
    for name, gradient in full_state(sp, grads=True).items():
        pairs.append((f"grad of {name}", gradient, parameters[name].grad))
    for module in (reference, sp):
        torch.optim.SGD(module.parameters(), lr=LR).step()
    for name, value in full_state(sp).items():
        pairs.append((f"{name} after a step", value, parameters[name]))
    return [(what, a.detach().cpu(), b.detach().cpu()) for what, a, b in pairs]


def likely_cause(what):
    name = what.removeprefix("grad of ").removesuffix(" after a step")
    if name in SEQUENCE_PARALLEL:
        return ("each rank's gradient of this replicated parameter covers only its sequence "
                "shard: is it marked sequence_parallel and summed by "
                "sync_sequence_parallel_grads?")
    return ("the collectives around the TP layers: all-gather along seq before the column "
            "layers (reduce-scatter backward), reduce-scatter after the row layers (all-gather "
            "backward), and no copy_to_tp / all-reduce left in between")


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_block_matches_the_single_device_block(run_on_ranks, tp):
    for rank, pairs in enumerate(run_on_ranks(sequence_parallel_pairs, tp)):
        for what, parallel, reference in pairs:
            assert_close(parallel, reference, what, rank=rank, likely_cause=likely_cause(what),
                         **TOLERANCE)


def unsynced_grads():
    reference, _, sp, *_ = run_both(sync=False)
    parameters = dict(reference.named_parameters())
    marked = {name: (p.grad.cpu(), parameters[name].grad.cpu())
              for name, p in sp.named_parameters() if getattr(p, "sequence_parallel", False)}
    return marked


def test_without_the_sync_the_layernorm_grads_are_partial(run_on_ranks):
    """The well-known SP bug, shown: each rank's layernorm (and row-bias) gradient is its shard's
    part only. The sum over ranks, which the sync computes, is the single-device gradient."""
    results = run_on_ranks(unsynced_grads, 2)
    assert set(results[0]) == SEQUENCE_PARALLEL
    for name in SEQUENCE_PARALLEL:
        reference = results[0][name][1]
        for rank, grads in enumerate(results):
            assert not torch.allclose(grads[name][0], reference, **TOLERANCE), (
                f"{name} on rank {rank}: the unsynced gradient already equals the single-device "
                "one, so the equivalence test could not catch a missing sync")
        assert_close(sum(grads[name][0] for grads in results), reference,
                     f"sum over ranks of the unsynced grad of {name}", **TOLERANCE)


def traced_passes(sequence_parallel: bool):
    """(op, payload bytes) of one forward, one backward and the sync, on this rank."""
    torch.manual_seed(0)
    block = Block(CONFIG).to(current_device())
    x = random(SHAPE, seed=1)
    if sequence_parallel:
        block, x = SequenceParallelBlock(block), my_shard(x)
    else:
        block = ParallelBlock(block)
    x = x.clone().requires_grad_()
    traces = [CommTracer() for _ in range(3)]
    with traces[0]:
        y = block(x)
    with traces[1]:
        y.backward(torch.ones_like(y))
    with traces[2]:
        sync_sequence_parallel_grads(block)
    return [sorted((call.op, call.nbytes) for call in trace.calls) for trace in traces]


def test_sequence_parallel_collectives_replace_the_all_reduces(run_on_ranks):
    tp = 4
    sp_passes = sorted([("all_gather", ACTIVATION_BYTES)] * 2 +
                       [("reduce_scatter", ACTIVATION_BYTES)] * 2)
    sync = [("all_reduce", len(SEQUENCE_PARALLEL) * CONFIG.hidden * 4)]  # one, coalesced
    for rank, (forward, backward, synced) in enumerate(run_on_ranks(traced_passes, tp, True)):
        assert forward == sp_passes, f"rank {rank}, SP forward: {forward}"
        assert backward == sp_passes, f"rank {rank}, SP backward: {backward}"
        assert synced == sync, f"rank {rank}, sync of the sequence-parallel grads: {synced}"
    tp_passes = [("all_reduce", ACTIVATION_BYTES)] * 2
    for rank, (forward, backward, synced) in enumerate(run_on_ranks(traced_passes, tp, False)):
        assert forward == backward == tp_passes, f"rank {rank}, TP block: {forward}, {backward}"
        assert synced == [], f"rank {rank}: a TP block has no sequence-parallel parameters"

    # The same ring traffic per rank: (n-1)/n S per all-gather or reduce-scatter, 2(n-1)/n S
    # per all-reduce (alpha_beta.py).
    def ring_bytes(calls):
        return sum((2 if op == "all_reduce" else 1) * (tp - 1) / tp * nbytes for op, nbytes in calls)

    assert ring_bytes(sp_passes) == ring_bytes(tp_passes)
