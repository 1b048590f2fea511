"""Lab 5, graded: the data-parallel gradient sync of hybrid parallelism (``data_parallel.py``);
ZeRO is graded in ``test_lab5_zero.py``, the hooks in ``test_lab5_ddp.py``.

* **SageMaker's layout** (the SageMaker model parallelism library documentation, "Ranking
  Mechanism ..." and "How Tensor Parallelism Works"): 4 CPU ranks, tp = 2, rdp = 2 (SageMaker's
  dp = 4); every rank holds its own 2 samples, a ``DistributedLinear`` over the TP group
  gathers the TP group's samples. After the student's ``sync_gradients(..., "sagemaker")``
  every parameter's gradient must be the single-device gradient of the whole batch.
* **Megatron's layout**: 4 CPU ranks, tp = 2, rdp = 2; a TP group shares its samples, a
  ``ParallelMLP`` is split over it. After ``sync_gradients(..., "megatron")`` the same.

When a gradient is wrong, the test works out *what* the student's sync did: it compares the
result with every candidate (summed over RDP_GROUP or DP_GROUP, divided by either group's
size, or not reduced) and names the one that matches.

Tolerance (fp32): gradients atol = rtol = 1e-6 (only the order of a sum changes; observed
~1e-8).
"""
import copy

import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.groups import build_rank_layout
from reference_impl.comm.device import current_device
from reference_impl.comm.process_groups import create_process_groups
from reference_impl.tp.sagemaker_linear import DistributedLinear
from reference_impl.tp.tp_layers import ParallelMLP, unshard
from reference_impl.toys import toy_and_batch, toy_grads, toy_loss

pytestmark = pytest.mark.lab5

TOLERANCE = dict(atol=1e-6, rtol=1e-6)
TIMEOUT = 120


# ----------------------------------------------------------------- a small model, its data

# ----------------------------------------------------------------- what a sync may have done

# (group summed over, group whose size divides): the plausible syncs a student may write
CANDIDATES = [("RDP", "DP"), ("DP", "DP"), ("RDP", "RDP"), ("DP", "RDP"), (None, None)]


def candidate_grads(model, groups):
    """Every parameter's gradient under every candidate sync, unsharded (collective)."""
    result = {}
    for name, p in model.named_parameters():
        for summed, divided in CANDIDATES:
            grad = p.grad.clone()
            if summed is not None:
                dist.all_reduce(grad, group=groups.of_kind(summed))
                grad /= dist.get_world_size(groups.of_kind(divided))
            result[name, summed, divided] = unshard(grad, p, groups.tp)
    return result


def diagnose(name, distributed, convention, actual, candidates, sizes):
    """What the student's sync did to ``name``'s gradient, as a likely cause."""
    for summed, divided in CANDIDATES:
        if torch.allclose(actual, candidates[name, summed, divided], **TOLERANCE):
            break
    else:
        return ("it matches no all-reduce over RDP_GROUP or DP_GROUP divided by either group's "
                "size: are the gradients copied back in place, in the plan's order?")
    kind = "TP-distributed" if distributed else "replicated across the TP group"
    if summed is None:
        return "it was not reduced at all: is it missing from gradient_plan?"
    where = f"reduced over {summed}_GROUP"
    if convention == "sagemaker":
        if summed == "RDP" and not distributed:
            return (f"{where} but it is {kind}, whose ranks hold other samples: SageMaker's "
                    "rule all-reduces it over the whole DP_GROUP")
        if summed == "DP" and distributed:
            return (f"{where} but it is {kind}: the TP peers hold *other* shards, which must "
                    "not be added to it; SageMaker's rule all-reduces it over RDP_GROUP only")
    elif summed == "DP":
        return (f"{where} but under Megatron's layout the TP peers hold the same samples (their "
                f"copies of a replicated gradient are equal, a sharded one is another shard): "
                "every gradient is all-reduced over RDP_GROUP")
    if divided != ("DP" if convention == "sagemaker" else "RDP"):
        right = "DP" if convention == "sagemaker" else "RDP"
        return (f"{where} (the right group) but divided by the {divided}_GROUP size "
                f"{sizes[divided]}, not by the number of data shards, the {right}_GROUP size "
                f"{sizes[right]}: see data_shards")
    return f"{where}, divided by the {divided}_GROUP size"


# ----------------------------------------------------------------- the two layouts

def synced_grads(impl, convention):
    """4 ranks, tp = 2, rdp = 2. ``convention`` picks the data layout, the TP layers and the
    sync convention together. The candidates are computed before the submission is loaded."""
    device = current_device()
    layout = build_rank_layout(4, tp=2, pp=1, order=convention)
    groups = create_process_groups(layout)
    toy, tokens, targets = toy_and_batch()
    toy, tokens, targets = toy.to(device), tokens.to(device), targets.to(device)
    model = copy.deepcopy(toy)
    coordinates = groups.coordinates
    if convention == "sagemaker":  # every DP rank its own 2 samples; fc gathers the TP group's
        model.fc = DistributedLinear(toy.fc, groups.tp)
        shard = slice(coordinates.dp_rank * 2, coordinates.dp_rank * 2 + 2)
    else:  # every replica its own 4 samples, the same on both TP ranks; the MLP is TP-split
        model.mlp = ParallelMLP(toy.mlp, groups.tp)
        shard = slice(coordinates.rdp_rank * 4, coordinates.rdp_rank * 4 + 4)
    toy_loss(model, tokens[shard], targets[shard]).backward()
    candidates = candidate_grads(model, groups)
    data_parallel = impl.module("data_parallel")
    distributed = {name: data_parallel.is_tp_distributed(owner, p)
                   for owner_name, owner in model.named_modules()
                   for name, p in ((f"{owner_name}.{n}" if owner_name else n, p)
                                   for n, p in owner.named_parameters(recurse=False))}
    data_parallel.sync_gradients(model, groups, convention, bucket_bytes=None)
    grads = {name: unshard(p.grad, p, groups.tp).cpu() for name, p in model.named_parameters()}
    candidates = {key: value.cpu() for key, value in candidates.items()}
    distributed = {name: bool(value) for name, value in distributed.items()}
    sizes = {kind: dist.get_world_size(groups.of_kind(kind)) for kind in ("RDP", "DP")}
    return grads, candidates, distributed, sizes


@pytest.mark.parametrize("convention", ["sagemaker", "megatron"])
def test_sync_gives_the_single_device_gradients(impl, run_on_ranks, convention):
    expected = toy_grads()
    results = run_on_ranks(synced_grads, 4, impl, convention, timeout=TIMEOUT)
    for rank, (grads, candidates, distributed, sizes) in enumerate(results):
        assert set(grads) == set(expected), f"rank {rank}: parameter names differ"
        for name, value in expected.items():
            if torch.allclose(grads[name].double(), value.double(), **TOLERANCE):
                continue
            cause = diagnose(name, distributed[name], convention, grads[name], candidates,
                             sizes)
            assert_close(grads[name], value, f"{convention} layout, tp=2, rdp=2: {name} grad",
                         rank=rank, likely_cause=cause, **TOLERANCE)


def plans(impl):
    """gradient_plan's names per group, for both conventions, of the toy with fc distributed."""
    toy, _, _ = toy_and_batch()
    toy.fc.weight.tp_dim = 1  # as DistributedLinear marks its shard: fc is TP-distributed
    gradient_plan = impl.module("data_parallel").gradient_plan
    return {convention: {kind: [name for name, _ in pairs]
                         for kind, pairs in gradient_plan(toy, convention).items()}
            for convention in ("sagemaker", "megatron")}


def test_gradient_plan_follows_sagemaker_and_megatron(impl, run_alone):
    """Which parameter goes to which group, without any communication."""
    toy, _, _ = toy_and_batch()
    found = run_alone(plans, impl)
    rdp, dp = found["sagemaker"]["RDP"], found["sagemaker"]["DP"]
    assert rdp == ["fc.weight", "fc.bias"], (
        f"sagemaker plan: RDP_GROUP gets {rdp}; SageMaker's rule: only the TP-distributed module's "
        "parameters (fc.weight, sharded, and its bias) are reduced over RDP_GROUP")
    assert dp == [n for n, _ in toy.named_parameters() if not n.startswith("fc.")], (
        f"sagemaker plan: DP_GROUP gets {dp}; SageMaker's rule: every replicated parameter, in the "
        "module's order")
    megatron = found["megatron"]
    assert megatron["DP"] == [], (
        "megatron plan: nothing goes over DP_GROUP (a TP group shares its samples: an "
        "all-reduce over DP_GROUP would sum tp equal copies)")
    assert megatron["RDP"] == [n for n, _ in toy.named_parameters()], (
        "megatron plan: every parameter over RDP_GROUP, in the module's order")
