"""Lab 2, graded: SageMaker's distributed linear ("How Tensor Parallelism Works") is a
data-parallel nn.Linear.

Each rank of a TP group brings its own samples. The reference is data parallelism: a replica of
the same nn.Linear on every rank, run on that rank's samples, its gradients all-reduced with a
**sum** over the TP group (the gradient of the group's summed loss), then one SGD step. The
distributed linear must give every rank the replica's output and input gradient, a weight
gradient that gathers to the summed one, the summed bias gradient on every rank, and the same
weights after the step.

Tolerance (fp32): atol = 1e-6, rtol = 1e-5; only the order of the additions differs. Measured
on CPU: outputs and input gradients within 3e-7; the weight gradient, a sum over every rank's
samples, within 4e-6 on entries of up to ~20 (6e-7 relative), i.e. at 0.6 of atol = rtol = 1e-6,
too close to hold on a GPU's different summation order.
"""
import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close_naming
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.equivalence import parameters_of, source_pairs
from reference_impl.toys import random

pytestmark = pytest.mark.lab2

TOLERANCE = dict(atol=1e-6, rtol=1e-5)
BATCH, SEQ, IN, OUT = 2, 3, 16, 10  # per rank; IN divisible by every tp tested, OUT by none but 1
LR = 0.1

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
BIAS_NOT_SUMMED = (
    "the bias gradient is this rank's own samples' part only: it was not summed over the group "
    "(the bias needs the operator that is the identity forward and sums backward)")


def gathered(module, group, grads=False):
    """Every parameter (or gradient) of ``module`` at full size: a shard (marked ``tp_dim``, one
    block per rank) is all-gathered over the group and concatenated along that dimension."""
    state = {}
    for name, parameter in module.named_parameters():
        local = (parameter.grad if grads else parameter.detach()).contiguous()
        dim = getattr(parameter, "tp_dim", None)
        if dim is not None:
            parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, local, group=group)
            local = torch.cat(parts, dim=dim)
        state[name] = local
    return state


def data_parallel_and_distributed(impl, tp):
    """On every rank: (what, distributed, data-parallel reference, {mistake: what it computes})
    in the order of the checks. Ranks 0..tp-1, tp..2tp-1, ... form the TP groups; each group has
    its own samples."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(start, start + tp))) for start in range(0, world, tp)]
    group = groups[rank // tp]
    tp_rank = dist.get_rank(group)

    torch.manual_seed(0)
    linear = nn.Linear(IN, OUT).to(current_device())
    samples = random((tp * BATCH, SEQ, IN), seed=1 + rank // tp).chunk(tp)[tp_rank]
    upstream = random((tp * BATCH, SEQ, OUT), seed=100 + rank // tp).chunk(tp)[tp_rank]

    # data parallelism, before the submission is loaded: the whole layer, my samples
    replica = copy.deepcopy(linear)
    before = parameters_of(linear)
    x_ref = samples.clone().requires_grad_()
    y_ref = replica(x_ref)
    y_ref.backward(upstream)
    own_bias_grad = replica.bias.grad.clone()
    for parameter in replica.parameters():
        dist.all_reduce(parameter.grad, group=group)  # sum over the TP group's ranks
    reference_grads = {name: p.grad.clone() for name, p in replica.named_parameters()}
    torch.optim.SGD(replica.parameters(), lr=LR).step()
    reference = dict(replica.named_parameters())
    mine = torch.zeros(IN, dtype=torch.bool, device=x_ref.device)
    mine[tp_rank * IN // tp:(tp_rank + 1) * IN // tp] = True
    mistakes = {"output": {BIAS_BEFORE_THE_SUM: y_ref + (tp - 1) * linear.bias},
                "input grad": {SLICE_KEPT: x_ref.grad * mine},
                "grad of bias": {BIAS_NOT_SUMMED: own_bias_grad}}

    layer = impl.module("sagemaker_linear").DistributedLinear(linear, group)
    x = samples.clone().requires_grad_()
    y = layer(x)
    y.backward(upstream)

    pairs = [("output", y, y_ref), ("input grad", x.grad, x_ref.grad)]
    for name, gradient in gathered(layer, group, grads=True).items():
        pairs.append((f"grad of {name}", gradient, reference_grads[name]))
    torch.optim.SGD(layer.parameters(), lr=LR).step()
    for name, value in gathered(layer, group).items():
        pairs.append((f"{name} after a step", value, reference[name]))
    pairs += source_pairs(linear, before)
    return [(what, a.detach().cpu(), b.detach().cpu(),
             {cause: value.detach().cpu() for cause, value in mistakes.get(what, {}).items()})
            for what, a, b in pairs]


def cause_of(what):
    if what.startswith("the single-device"):
        return LIKELY_CAUSES["source"]
    return LIKELY_CAUSES.get(what, LIKELY_CAUSES["step"])


@pytest.mark.parametrize("world, tp", [(1, 1), (2, 2), (4, 4), (4, 2)],
                         ids=["tp1", "tp2", "tp4", "two-tp2-groups"])
def test_distributed_linear_is_a_data_parallel_linear(impl, run_on_ranks, world, tp):
    for rank, pairs in enumerate(run_on_ranks(data_parallel_and_distributed, world, impl, tp)):
        for what, distributed, reference, mistakes in pairs:
            assert_close_naming(distributed, reference, what, rank=rank, mistakes=mistakes,
                                otherwise=cause_of(what), **TOLERANCE)


def refusal(impl):
    """The size check, after a layer that it must accept (IN divides by 4, OUT need not)."""
    layer = impl.module("sagemaker_linear").DistributedLinear
    layer(nn.Linear(IN, OUT))
    try:
        layer(nn.Linear(10, 6))
    except ValueError as error:
        return str(error)
    return None


def test_distributed_linear_refuses_input_features_that_do_not_divide(impl, run_on_ranks):
    expected = "input features 10 is not divisible by the tensor-parallel size tp = 4"
    for rank, error in enumerate(run_on_ranks(refusal, 4, impl)):
        assert error is not None and expected in error, (
            f"rank {rank}: DistributedLinear(nn.Linear(10, 6)) on 4 ranks gave {error!r}; the "
            f"weight is split by input features, so it must refuse: {expected!r}")


def traced_calls(impl):
    """The collectives of one forward and one backward: (op, payload bytes) lists."""
    layer = impl.module("sagemaker_linear").DistributedLinear(
        nn.Linear(IN, OUT).to(current_device()))
    x = random((BATCH, SEQ, IN), seed=dist.get_rank()).requires_grad_()
    with CommTracer() as forward:
        y = layer(x)
    with CommTracer() as backward:
        y.backward(torch.ones_like(y))
    return [[(call.op, call.nbytes) for call in trace.calls] for trace in (forward, backward)]


def test_one_all_gather_and_one_reduce_scatter_per_pass(impl, run_on_ranks):
    tp = 4
    gathered_input = tp * BATCH * SEQ * IN * 4  # fp32 bytes of the group's samples
    group_output = tp * BATCH * SEQ * OUT * 4  # fp32 bytes of the partial outputs
    for rank, (forward, backward) in enumerate(run_on_ranks(traced_calls, tp, impl)):
        assert sorted(forward) == sorted([("all_gather", gathered_input),
                                          ("reduce_scatter", group_output)]), (
            f"rank {rank}: the forward should all-gather the group's samples and reduce-scatter "
            f"the partial outputs, once each; it ran {forward}")
        assert sorted(backward) == sorted([("all_gather", group_output),
                                           ("all_reduce", OUT * 4),
                                           ("reduce_scatter", gathered_input)]), (
            f"rank {rank}: the backward should all-gather the output gradients, reduce-scatter "
            f"the input gradients and all-reduce the bias gradient, once each; it ran {backward}")
