"""Lab 5, graded: the data-parallel gradient sync of hybrid parallelism (``data_parallel.py``);
ZeRO is graded in ``test_lab5_zero.py``, the hooks in ``test_lab5_ddp.py``.

* **The plan alone** (one process, no communication): which group each parameter of the toy
  goes to, under both conventions, with ``fc`` TP-distributed.
* **The sync, swept** (``--sweep-seed N`` draws another batch; every failure prints its seed
  and case), under both conventions, on 4 CPU ranks cut by ``build_rank_layout`` into every
  shape the question has: tp = 2 (one stage, rdp = 2: SageMaker's dp = 4 is the world,
  Megatron's data-parallel group is not), pp = 2 (two stages, each its own data-parallel
  groups of 2: the world is neither), and the world as one data-parallel group; each with its
  RDP groups of consecutive ranks ({0, 1} {2, 3}) and strided ones ({0, 2} {1, 3}), every group
  of a layout at once.

  * **SageMaker's layout** (the SageMaker model parallelism library documentation, "Ranking
    Mechanism ..." and "How Tensor Parallelism Works"): every rank of a DP group holds its own
    slice of the batch, a ``DistributedLinear`` over the TP group gathers the TP group's
    samples.
  * **Megatron's layout**: a TP group shares its samples, which are split over the replicas
    (RDP); a ``ParallelMLP`` is split over the TP group.

  Gradient groups never leave a pipeline stage, so with pp = 2 each stage holds (for this
  check) its own copy of the toy and the whole batch split over its data shards. After the
  student's ``sync_gradients(..., convention)`` every parameter's gradient, on every rank of
  every case, must be the single-device gradient of the whole batch.

When a gradient is wrong, the test works out *what* the student's sync did: it compares the
result with every candidate (summed over RDP_GROUP or DP_GROUP, divided by the size of either
group or of the world, or not reduced) and names the one that matches, preferring the divisor
that explains every case of the sweep (where the group sizes of one case coincide, another
case tells them apart).

Tolerance (fp32): gradients atol = rtol = 1e-6 (only the order of a sum changes; observed
~1e-8).
"""
import copy

import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.comm.groups import build_rank_layout
from reference_impl.comm.process_groups import create_process_groups
from reference_impl.course.sweeps import label
from reference_impl.toys import BATCH, SEQ, VOCAB, toy_and_batch, toy_loss
from reference_impl.tp.sagemaker_linear import DistributedLinear
from reference_impl.tp.tp_layers import ParallelMLP, unshard

pytestmark = pytest.mark.lab5

WORLD = 4
TOLERANCE = dict(atol=1e-6, rtol=1e-6)
TIMEOUT = 120
# (tp, pp) of the sweep, and the orders that make the RDP groups consecutive or strided
SHAPES = ((2, 1), (1, 2), (1, 1))
ORDERS = {"consecutive": "rdp-tp-pp", "strided": "tp-pp-rdp"}


def sync_cases(convention: str, shapes=SHAPES, world: int = WORLD) -> list[dict]:
    """Every shape with both layouts of its RDP groups (one where rdp is 1 or the world)."""
    cases = []
    for tp, pp in shapes:
        rdp = world // (tp * pp)
        layouts = ["world"] if rdp == world else ["consecutive"] if rdp == 1 else list(ORDERS)
        cases += [{"convention": convention, "tp": tp, "pp": pp, "layout": layout}
                  for layout in layouts]
    return cases


def seeded_batch(seed: int):
    """The toy and a batch of its shape drawn from ``seed`` (on the CPU)."""
    toy, _, _ = toy_and_batch()
    generator = torch.Generator().manual_seed(1000 + seed)
    tokens, targets = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
                       for _ in range(2))
    return toy, tokens, targets


def single_device_grads(seed: int) -> dict:
    """One device's gradients of the toy's mean loss on the whole batch."""
    toy, tokens, targets = seeded_batch(seed)
    toy_loss(toy, tokens, targets).backward()
    return {name: p.grad.clone() for name, p in toy.named_parameters()}


# ----------------------------------------------------------------- what a sync may have done

# (group summed over, group whose size divides): the plausible syncs a student may write
SUMMED, DIVIDED = ("RDP", "DP"), ("DP", "RDP", "WORLD")
CANDIDATES = [(s, d) for s in SUMMED for d in DIVIDED] + [(None, None)]


def candidate_grads(model, groups):
    """Every parameter's gradient under every candidate sync, unsharded (collective)."""
    result = {}
    for name, p in model.named_parameters():
        result[name, None, None] = unshard(p.grad.clone(), p, groups.tp)
        for summed in SUMMED:
            total = p.grad.clone()
            dist.all_reduce(total, group=groups.of_kind(summed))
            for divided in DIVIDED:
                result[name, summed, divided] = unshard(
                    total / dist.get_world_size(groups.of_kind(divided)), p, groups.tp)
    return result


def matches(actual, candidates, name) -> list[tuple]:
    return [(summed, divided) for summed, divided in CANDIDATES
            if torch.allclose(actual, candidates[name, summed, divided], **TOLERANCE)]


def divisors_everywhere(results, cases, seed) -> set:
    """The divisors (group kinds) that explain every gradient of every rank of every case
    (a sync divides every gradient by one number, whatever its group)."""
    found = set(DIVIDED)
    for case in cases:
        for per_case in results:
            result = per_case[label(case, seed)]
            if result["error"] is not None:
                continue
            for name, actual in result["grads"].items():
                here = {d for s, d in matches(actual, result["candidates"], name) if s}
                if any(s is None for s, _ in matches(actual, result["candidates"], name)):
                    here = set(DIVIDED)  # not reduced: says nothing of the divisor
                found &= here
    return found


def diagnose(name, distributed, convention, actual, candidates, sizes, preferred):
    """What the student's sync did to ``name``'s gradient, as a likely cause."""
    found = sorted(matches(actual, candidates, name), key=lambda c: c[1] not in preferred)
    if not found:
        return ("it matches no all-reduce over RDP_GROUP or DP_GROUP divided by either group's "
                "size or the world's: are the gradients copied back in place, in the plan's "
                "order?")
    summed, divided = found[0]
    kind = "TP-distributed" if distributed else "replicated across the TP group"
    if summed is None:
        return "it was not reduced at all: is it missing from gradient_plan?"
    where = f"reduced over {summed}_GROUP"
    if convention == "sagemaker" and sizes["DP"] != sizes["RDP"]:
        if summed == "RDP" and not distributed:
            return (f"{where} but it is {kind}, whose ranks hold other samples: SageMaker's "
                    "rule all-reduces it over the whole DP_GROUP")
        if summed == "DP" and distributed:
            return (f"{where} but it is {kind}: the TP peers hold *other* shards, which must "
                    "not be added to it; SageMaker's rule all-reduces it over RDP_GROUP only")
    elif summed == "DP" and sizes["DP"] != sizes["RDP"]:
        return (f"{where} but under Megatron's layout the TP peers hold the same samples (their "
                f"copies of a replicated gradient are equal, a sharded one is another shard): "
                "every gradient is all-reduced over RDP_GROUP")
    right = "DP" if convention == "sagemaker" else "RDP"
    if sizes[divided] != sizes[right]:
        group = "the world" if divided == "WORLD" else f"the {divided}_GROUP"
        return (f"{where} (the right group) but divided by the size of {group}, "
                f"{sizes[divided]}, not by the number of data shards, the {right}_GROUP size "
                f"{sizes[right]}: see data_shards (the groups of one stage are not the world, "
                "and which group holds distinct samples depends on the convention)")
    return f"{where}, divided by the {divided}_GROUP size"


# ----------------------------------------------------------------- the sweep, on every rank

def build_model(toy, groups, convention):
    """This rank's copy of the toy and its data shard (index, number of shards)."""
    model, coordinates = copy.deepcopy(toy), groups.coordinates
    if convention == "sagemaker":  # every DP rank its own samples; fc gathers the TP group's
        model.fc = DistributedLinear(toy.fc, groups.tp)
        return model, coordinates.dp_rank, dist.get_world_size(groups.dp)
    model.mlp = ParallelMLP(toy.mlp, groups.tp)  # a TP group shares its samples
    return model, coordinates.rdp_rank, dist.get_world_size(groups.rdp)


def synced_grads(impl, seed, cases, world=WORLD):
    """Every case on this rank: {case label: gradients after the sync, candidates, ...}. The
    candidates are computed before the submission is loaded."""
    device = current_device()
    found = {}
    for case in cases:
        order = ORDERS.get(case["layout"], "tp-pp-rdp")
        groups = create_process_groups(build_rank_layout(world, case["tp"], case["pp"], order))
        toy, tokens, targets = (t.to(device) for t in seeded_batch(seed))
        model, shard, shards = build_model(toy, groups, case["convention"])
        size = BATCH // shards
        mine = slice(shard * size, (shard + 1) * size)
        toy_loss(model, tokens[mine], targets[mine]).backward()
        candidates = {key: value.cpu() for key, value in candidate_grads(model, groups).items()}
        result = {"candidates": candidates, "error": None, "sizes": {
            kind: dist.get_world_size(groups.of_kind(kind)) for kind in ("RDP", "DP", "WORLD")}}
        try:
            data_parallel = impl.module("data_parallel")
            result["distributed"] = {
                f"{owner_name}.{n}" if owner_name else n: bool(
                    data_parallel.is_tp_distributed(owner, p))
                for owner_name, owner in model.named_modules()
                for n, p in owner.named_parameters(recurse=False)}
            data_parallel.sync_gradients(model, groups, case["convention"], bucket_bytes=None)
            result["grads"] = {name: unshard(p.grad, p, groups.tp).cpu()
                               for name, p in model.named_parameters()}
        except Exception as error:  # named in the test, with the case
            result["error"] = f"{type(error).__name__}: {error}"
        found[label(case, seed)] = result
    return found


def check_sync_sweep(run_on_ranks, impl, seed, cases, world=WORLD):
    """Run ``cases`` on ``world`` ranks; every gradient against one device's."""
    expected = single_device_grads(seed)
    results = run_on_ranks(synced_grads, world, impl, seed, cases, world, timeout=TIMEOUT)
    for case in cases:
        where = label(case, seed)
        for rank, found in enumerate(results):
            assert found[where]["error"] is None, (
                f"[{where}] rank {rank}: sync_gradients raised {found[where]['error']}")
    preferred = divisors_everywhere(results, cases, seed)
    for case in cases:
        where = label(case, seed)
        for rank, found in enumerate(results):
            result = found[where]
            grads, sizes = result["grads"], result["sizes"]
            assert set(grads) == set(expected), f"[{where}] rank {rank}: parameter names differ"
            for name, value in expected.items():
                if torch.allclose(grads[name].double(), value.double(), **TOLERANCE):
                    continue
                cause = diagnose(name, result["distributed"][name], case["convention"],
                                 grads[name], result["candidates"], sizes, preferred)
                assert_close(grads[name], value, f"[{where}] {name} grad", rank=rank,
                             against="one device on the whole batch", likely_cause=cause,
                             **TOLERANCE)


@pytest.mark.parametrize("convention", ["sagemaker", "megatron"])
def test_sync_gives_the_single_device_gradients(impl, run_on_ranks, sweep_seed, convention):
    check_sync_sweep(run_on_ranks, impl, sweep_seed, sync_cases(convention))


# ----------------------------------------------------------------- the plan alone

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
