"""Lab 2, graded: SageMaker's distributed linear ("How Tensor Parallelism Works") is a
data-parallel nn.Linear.

Each rank of a TP group brings its own samples. The reference is data parallelism: a replica of
the same nn.Linear on every rank, run on that rank's samples, its gradients all-reduced with a
**sum** over the TP group (the gradient of the group's summed loss), then one SGD step. The
distributed linear must give every rank the replica's output and input gradient, a weight
gradient that gathers to the summed one, the summed bias gradient on every rank, and the same
weights after each of two steps.

What is swept (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws another permuted
layout and other numbers): on 4 ranks, TP groups of 1, of 2 (consecutive, strided, permuted)
and the world, every group of a layout at once with samples of its own; the communication
contract (kind, group ranks, bytes) on the same layouts.

Tolerance (fp32): atol = 1e-6, rtol = 1e-5; only the order of the additions differs. Measured
on CPU: outputs and input gradients within 3e-7; the weight gradient, a sum over every rank's
samples, within 4e-6 on entries of up to ~20 (6e-7 relative), i.e. at 0.6 of atol = rtol = 1e-6,
too close to hold on a GPU's different summation order.
"""
import copy
import zlib

import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close_naming, attempt
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import group_layouts, group_of, label
from reference_impl.equivalence import parameters_of, source_pairs
from reference_impl.toys import random

pytestmark = pytest.mark.lab2

TOLERANCE = dict(atol=1e-6, rtol=1e-5)
WORLD = 4
BATCH, SEQ, IN, OUT = 2, 3, 16, 10  # per rank; IN divisible by every tp tested, OUT by none but 1
LR = 0.1
STEPS = 2  # the parameters after each step: a second step starts from the first's

LIKELY_CAUSES = {
    "output": "the forward pass: is the weight's input-column slice taken at this rank's "
              "position in the group (dist.get_rank(group)), are the partial outputs "
              "reduce-scattered along the batch dimension, and the bias added once, after?",
    "input grad": "the output matches, so the forward is right: every rank's columns contribute "
                  "to every sample's input gradient, so the gathered samples' gradient is summed "
                  "over the group and each rank keeps its own samples' part",
    "grad of weight": "the weight gradient must be that of every rank's samples (the DP sum): "
                      "every rank needs every rank's output gradient in the backward",
    "grad of bias": "the bias gradient must be the whole group's (the DP sum)",
    "step": "the gradients match, so the optimizer step differs: is a parameter missing from "
            "the optimizer, or updated twice?",
    "source": "the distributed linear shares this parameter with the nn.Linear it was built "
              "from (the same tensor, not a copy): its step went into the original too",
}
BIAS_BEFORE_THE_SUM = (
    "the bias was added to every rank's partial outputs, before the reduce-scatter: the sum "
    "then counts it tp times; it is added once, after")
SLICE_KEPT = (
    "exactly this rank's own input columns are right and the others are zero: the backward of "
    "the all-gather kept this rank's slice (gather_from_tp) instead of summing every rank's part "
    "of the gathered samples' gradient (a reduce-scatter)")
BIAS_AVERAGED = (
    "the bias gradient is the group's mean, 1/tp of its sum: the operator that is the identity "
    "forward averaged in its backward instead of summing (copy_to_tp's backward, lab 2's "
    "tp_collectives: its own test names it)")
BIAS_NOT_SUMMED = (
    "the bias gradient is this rank's own samples' part only: it was not summed over the group "
    "(the bias needs the operator that is the identity forward and sums backward)")


def gathered(module, group, grads=False):
    """Every parameter (or gradient) of ``module`` at full size: every rank's shard (marked with
    its dimension) is written at the entries lab 2's snapshot says that rank holds."""
    state, tp = {}, dist.get_world_size(group)
    for name, parameter in module.named_parameters():
        local = (parameter.grad if grads else parameter.detach()).contiguous()
        split = getattr(parameter, "tp_dim", None)
        if split is not None:
            parts = [torch.empty_like(local) for _ in range(tp)]
            dist.all_gather(parts, local, group=group)
            count = local.shape[split] * tp
            whole = local.new_empty(local.shape[:split] + (count,) + local.shape[split + 1:])
            for r, part in enumerate(parts):
                entries = snapshot("lab2", "positions")[f"{count}/1/{tp}"][r]
                whole.index_copy_(split, torch.tensor(entries, device=local.device), part)
            local = whole
        state[name] = local
    return state


def layouts(tp: int, seed: int) -> list[str]:
    """The layouts of groups of ``tp`` swept on WORLD ranks."""
    return list(group_layouts(WORLD, tp, seed))


def data_parallel_and_distributed(impl, tp, seed, steps=STEPS, sizes=(IN, OUT)):
    """On every rank, per layout of groups of ``tp``: (what, distributed, data-parallel
    reference, {mistake: what it computes}) in the order of the checks, over ``steps`` steps
    (each step's output, gradients and parameters). Every group has samples of its own."""
    rank = dist.get_rank()
    inputs, outputs = sizes
    handles = {}
    for name, groups in group_layouts(WORLD, tp, seed).items():  # every rank, the same order
        made = [dist.new_group(ranks) for ranks in groups]
        handles[name] = (made[groups.index(group_of(rank, groups))], groups.index(group_of(rank, groups)))
    found = {}
    for name, (group, index) in handles.items():
        found[name] = attempt(lambda: one_layout(impl, tp, seed, group, index, steps, inputs,
                                                 outputs, name))
    return found



def one_layout(impl, tp, seed, group, index, steps, inputs, outputs, name):
    tp_rank = dist.get_rank(group)
    key = zlib.crc32(f"{seed}/{tp}/{name}/{index}".encode())
    torch.manual_seed(key % 2**31)
    linear = nn.Linear(inputs, outputs).to(current_device())
    replica = copy.deepcopy(linear)  # data parallelism, before the submission is loaded
    before = parameters_of(linear)
    layer = impl.module("sagemaker_linear").DistributedLinear(linear, group)
    mine = torch.zeros(inputs, dtype=torch.bool, device=current_device())
    mine[snapshot("lab2", "positions")[f"{inputs}/1/{tp}"][tp_rank]] = True
    replica_optimizer = torch.optim.SGD(replica.parameters(), lr=LR)
    optimizer = torch.optim.SGD(layer.parameters(), lr=LR)
    pairs = []
    for step in range(steps):
        samples = random((tp * BATCH, SEQ, inputs), seed=key + step).chunk(tp)[tp_rank]
        upstream = random((tp * BATCH, SEQ, outputs), seed=key + 100 + step).chunk(tp)[tp_rank]
        x_ref = samples.clone().requires_grad_()
        y_ref = replica(x_ref)
        y_ref.backward(upstream)
        own_bias_grad = replica.bias.grad.clone()
        for parameter in replica.parameters():
            dist.all_reduce(parameter.grad, group=group)  # sum over the TP group's ranks
        reference_grads = {n: p.grad.clone() for n, p in replica.named_parameters()}
        mistakes = {"output": {BIAS_BEFORE_THE_SUM: y_ref + (tp - 1) * replica.bias},
                    "input grad": {SLICE_KEPT: x_ref.grad * mine} if tp > 1 else {},
                    "grad of bias": {BIAS_NOT_SUMMED: own_bias_grad,
                                     BIAS_AVERAGED: reference_grads["bias"] / tp}
                    if tp > 1 else {}}
        replica_optimizer.step()
        replica_optimizer.zero_grad()

        x = samples.clone().requires_grad_()
        y = layer(x)
        y.backward(upstream)
        found = [("output", y, y_ref), ("input grad", x.grad, x_ref.grad)]
        found += [(f"grad of {n}", g, reference_grads[n])
                  for n, g in gathered(layer, group, grads=True).items()]
        optimizer.step()
        optimizer.zero_grad()
        reference = dict(replica.named_parameters())
        found += [(f"{n} after a step", v, reference[n]) for n, v in gathered(layer, group).items()]
        pairs += [(what, step, a.detach().cpu().clone(), b.detach().cpu().clone(),
                   {cause: value.detach().cpu() for cause, value in mistakes.get(what, {}).items()})
                  for what, a, b in found]
    pairs += [(what, steps - 1, a, b, {}) for what, a, b in source_pairs(linear, before)]
    return pairs


def cause_of(what):
    if what.startswith("the single-device"):
        return LIKELY_CAUSES["source"]
    return LIKELY_CAUSES.get(what, LIKELY_CAUSES["step"])


def check_data_parallel(results, tp, seed, steps=STEPS, tolerance=TOLERANCE):
    """Every layout's pairs, step by step, on every rank; the first wrong one names its
    cause."""
    for name in layouts(tp, seed):
        where = label({"tp": tp, "layout": name}, seed)
        for rank, found in enumerate(results):
            pairs = found[name]
            assert not isinstance(pairs, str), (
                f"DistributedLinear [{where}] raised on rank {rank}: {pairs}")
            for what, step, distributed, reference, mistakes in pairs:
                assert_close_naming(distributed, reference,
                                    f"DistributedLinear's {what}, step {step + 1} of {steps} "
                                    f"[{where}]", rank=rank, mistakes=mistakes,
                                    otherwise=cause_of(what), **tolerance)


@pytest.mark.parametrize("tp", [1, 2, 4], ids=["tp1", "tp2-layouts", "tp4"])
def test_distributed_linear_is_a_data_parallel_linear(impl, run_on_ranks, sweep_seed, tp):
    results = run_on_ranks(data_parallel_and_distributed, WORLD, impl, tp, sweep_seed)
    check_data_parallel(results, tp, sweep_seed)


def refusal(impl, inputs, outputs):
    """The size check, after a layer that it must accept (IN divides by 4, OUT need not)."""
    layer = impl.module("sagemaker_linear").DistributedLinear
    layer(nn.Linear(IN, OUT))
    try:
        layer(nn.Linear(inputs, outputs))
    except ValueError as error:
        return str(error)
    return None


def check_refusal(run_on_ranks, impl, inputs, outputs):
    expected = f"input features {inputs} is not divisible by the tensor-parallel size tp = {WORLD}"
    for rank, error in enumerate(run_on_ranks(refusal, WORLD, impl, inputs, outputs)):
        assert error is not None and expected in error, (
            f"rank {rank}: DistributedLinear(nn.Linear({inputs}, {outputs})) on {WORLD} ranks "
            f"gave {error!r}; the weight is split by input features, so it must refuse: "
            f"{expected!r}")


def test_distributed_linear_refuses_input_features_that_do_not_divide(impl, run_on_ranks):
    check_refusal(run_on_ranks, impl, 10, 6)


def traced_calls(impl, tp, seed, sizes=(IN, OUT)):
    """Per layout: the collectives of one forward and one backward (CommCall data)."""
    rank = dist.get_rank()
    found = {}
    for name, groups in group_layouts(WORLD, tp, seed).items():
        made = [dist.new_group(ranks) for ranks in groups]
        group = made[groups.index(group_of(rank, groups))]
        layer = impl.module("sagemaker_linear").DistributedLinear(
            nn.Linear(*sizes).to(current_device()), group)
        x = random((BATCH, SEQ, sizes[0]), seed=rank).requires_grad_()
        with CommTracer() as forward:
            y = layer(x)
        with CommTracer() as backward:
            y.backward(torch.ones_like(y))
        found[name] = [[call.as_data() for call in trace.calls] for trace in (forward, backward)]
    return found


CONTRACT = ("forward: one all-gather of the group's samples and one reduce-scatter of the partial "
            "outputs; backward: one all-gather of the output gradients, one reduce-scatter of the "
            "input gradients and one all-reduce of the bias gradient; all over the TP group")


def check_communication(results, tp, seed, sizes=(IN, OUT)):
    inputs, outputs = sizes
    samples = tp * BATCH * SEQ * inputs * 4  # fp32 bytes of the group's samples
    partial = tp * BATCH * SEQ * outputs * 4  # fp32 bytes of the partial outputs
    for name, groups in group_layouts(WORLD, tp, seed).items():
        where = f"DistributedLinear [{label({'tp': tp, 'layout': name}, seed)}]"
        for rank, found in enumerate(results):
            ranks = group_of(rank, groups)
            forward = [expected("all_gather", ranks, samples),
                       expected("reduce_scatter", ranks, partial)]
            backward = [expected("all_gather", ranks, partial),
                        expected("all_reduce", ranks, outputs * 4),
                        expected("reduce_scatter", ranks, samples)]
            for phase, calls, wanted in zip(("forward", "backward"), found[name],
                                            (forward, backward)):
                check_contract(calls, wanted, f"{where}: the {phase}", rank=rank,
                               formula=CONTRACT)


@pytest.mark.parametrize("tp", [2, 4], ids=["tp2-layouts", "tp4"])
def test_one_all_gather_and_one_reduce_scatter_per_pass(impl, run_on_ranks, sweep_seed, tp):
    check_communication(run_on_ranks(traced_calls, WORLD, impl, tp, sweep_seed), tp, sweep_seed)
