"""Lab 5, graded: ZeRO (``zero.py``, Rajbhandari et al. 2020): the padded shards, then ZeRO-1, 2
and 3 training with AdamW, its gradient reduction read before its step.

* **Shards** (one process, no communication): for parameters of 5, 10, 12 and 35
  elements over N = 2, 3 and 4 ranks, every rank's ``my_slice`` against the flattened
  parameter padded with zeros to N * ceil(numel / N) and cut in N.
* **Training, swept** (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws another
  permuted layout, every failure prints its seed and case): stages 1, 2 and 3, each on 4 CPU
  ranks cut into data-parallel groups of 2 (consecutive {0, 1} {2, 3}, strided {0, 2} {1, 3},
  permuted) and of 4 (the world), every group of a layout at once, each on batches of its own,
  so a collective over the world, or a mean over the world size, gives other numbers. Every
  parameter has an odd number of elements (hidden 5, FFN 7), so none divides into N equal
  shards without padding. The optimizer is AdamW (``decoupled_weight_decay``) with two
  parameter groups (weight decay on the matrices only) and eps = 1; the lr is halved after the
  first step, through ``param_groups``. Each of 3 steps accumulates two micro-batches, then
  calls ``reduce_gradients()`` and reads the gradients, then ``step()`` and reads the rest.

After each step, every rank's state against unsharded ``torch.optim.AdamW`` on the group's
averaged gradients, computed here in pytest's process from a fresh model the submission never
saw, in this order (the gradient reduction is blamed before the step):

1. **the communication contract** (``comm_contract.check_contract``) of each phase, over the
   optimizer's group, payloads as ``comm_trace`` counts them (P the padded numel, 4 bytes each):
   ZeRO-1: nothing in the backward, one all-reduce of each whole gradient in
   ``reduce_gradients``, one all-gather of P per parameter in ``step``; ZeRO-2: one
   reduce-scatter of P per parameter in each micro-batch's backward, one all-gather of P per
   parameter in ``step``; ZeRO-3: in each micro-batch an all-gather of P per parameter before
   its module's forward, another before its backward, a reduce-scatter of P after it, nothing in
   ``step`` (the next forward gathers);
2. **the gradients after ``reduce_gradients()``**: ``param.grad`` the group's mean under ZeRO-1
   (as DDP leaves it), None under ZeRO-2 and 3; every rank's shard of the mean
   (``shards[param].grad``, padded) under every stage;
3. **Adam's state after ``step()``**: each shard's m and v (``exp_avg``, ``exp_avg_sq``) against
   torch's, sliced and padded the same way, and its step count;
4. **the parameters after ``step()``** (``full_state_dict()``, whole on every rank), and,
   after the first backward, the model-state bytes against the fp32 formula
   (``memory/model_states.py``: 8 + 8/N, 4 + 12/N, 16/N bytes per parameter, each padded).

Before the submission is loaded, each rank starts recording every collective (its kind, its
ranks, the sizes of its pieces, the phase of the run it came in), and the run catches an
exception rather than dying, so that a failure is named from what the ranks did. Where the
parameters are wrong, the test compares them with the results of the usual mistakes (averaged
over the world size, summed over the world, not averaged, averaged twice, not reduced,
micro-batches overwritten), each trained here too, and otherwise says which shards are wrong.
The world layout is checked first: on groups of 2 in a world of 4, "averaged over the world
size" and "averaged twice" both halve the mean, while on the world only the second is wrong.

**A parameter that gets no gradient in a step** (a branch the step skips), stages 1 to 3 on 2
ranks, two steps: it keeps its weights and its Adam state, and its first step with a gradient
is its first, as torch's Adam has it.

Adam's update g / (sqrt(v) + eps) ignores the gradient's scale when eps is tiny: a gradient
summed instead of averaged would pass. With eps = 1 the scale shows. Tolerance (fp32): 1e-6
absolute and relative (Adam's own arithmetic per element; only the order of sums changes;
observed within 1e-7).
"""
import functools
import inspect
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close, assert_close_naming, raised_in
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.comm.rank_failures import RankFailure
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import group_layouts, group_of, label
from reference_impl.memory.model_states import zero_memory_formula
from reference_impl.model import MLP

pytestmark = pytest.mark.lab5

WORLD, HIDDEN, FFN = 4, 5, 7  # 5, 7 and 35 elements: none divides by 2 or 4
DP_SIZES = (2, 4)
STEPS, MICRO, LR, EPS, DECAY = 3, 2, 1e-2, 1.0, 0.1
LR_AFTER_FIRST_STEP = LR / 2
TOLERANCE = dict(atol=1e-6, rtol=1e-6)
TIMEOUT = 120
ACTION = {"all_reduce": "all-reduced", "all_gather": "all-gathered",
          "all_gather_into_tensor": "all-gathered", "reduce_scatter": "reduce-scattered",
          "reduce_scatter_tensor": "reduce-scattered"}
SAME_OPERATION = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
AVERAGED_A_COPY = (
    "ZeRO-1 averaged a copy: param.grad is still this rank's own gradient. reduce_gradients "
    "must leave the group's mean in param.grad (as DDP does: gradient clipping and logging read "
    "it there), then keep this rank's shard of it")
STAGE3_WHOLE = (
    "stage 3 keeps only this rank's shard of every parameter (shard.master); the step updates "
    "it in place and copies nothing back into the parameter, whose storage is empty between "
    "layers (the next forward gathers it)")


def zero_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(HIDDEN), MLP(HIDDEN, FFN), nn.LayerNorm(HIDDEN))


def decay_groups(model) -> list[dict]:
    """AdamW's parameter groups: weight decay on the matrices, none on biases and norms."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": matrices, "weight_decay": DECAY}, {"params": others, "weight_decay": 0.0}]


def zero_batch(step: int, group: int, member: int, micro: int):
    """Micro-batch ``micro`` of step ``step`` for rank ``member`` of data-parallel group
    ``group``: (input, the gradient of the output)."""
    generator = torch.Generator().manual_seed(1000 * step + 100 * group + 10 * micro + member)
    return (torch.randn(2, 3, HIDDEN, generator=generator),
            torch.randn(2, 3, HIDDEN, generator=generator))


def layouts(seed: int) -> list[tuple[int, str, list[list[int]]]]:
    return [(dp, name, groups) for dp in DP_SIZES
            for name, groups in group_layouts(WORLD, dp, seed).items()]


def case_of(stage: int, dp: int, layout: str, dtype: str = "fp32") -> dict:
    return {"stage": stage, "dp": dp, "layout": layout, "dtype": dtype}


# ----------------------------------------------------------------- the shards, alone

SHARD_CASES = [((5,), 2), ((7, 5), 2), ((2, 5), 4), ((12,), 4), ((5,), 3)]


def slices_alone(impl, cases):
    """Every rank's ``my_slice`` of a parameter 1, 2, ..., numel, for every case."""
    zero = impl.module("zero")
    found = {}
    for shape, n in cases:
        param = nn.Parameter(torch.arange(1.0, math.prod(shape) + 1).reshape(shape))
        pieces = []
        for rank in range(n):
            try:
                pieces.append(zero._ShardedParameter(param, n, rank).my_slice(param).clone())
            except Exception as error:  # named in the test, with the case
                pieces.append(f"{type(error).__name__}: {error}")
        found[f"{shape}/{n}"] = pieces
    return found


def check_shards(impl, run_alone, cases):
    """Every rank's shard of every (shape, N) case against the padded flat parameter."""
    found = run_alone(slices_alone, impl, cases)
    for shape, n in cases:
        numel = math.prod(shape)
        size = -(-numel // n)
        flat = torch.cat([torch.arange(1.0, numel + 1), torch.zeros(size * n - numel)])
        where = f"a parameter of shape {shape} ({numel} elements) over N = {n}"
        for rank, piece in enumerate(found[f"{shape}/{n}"]):
            assert not isinstance(piece, str), (
                f"rank {rank}'s my_slice of {where} raised {piece}")
            expected = flat[rank * size:(rank + 1) * size]
            assert piece.numel() == size, (
                f"rank {rank}'s shard of {where} has {piece.numel()} elements, not ceil({numel}/"
                f"{n}) = {size}: every rank's shard has the same size, so the flattened "
                f"parameter is padded with zeros to N x {size} = {size * n} elements before "
                "it is cut (the last shard holds the padding)")
            tail = (expected == 0) & (piece.reshape(-1) != 0)
            assert not tail.any(), (
                f"rank {rank}'s shard of {where} has {piece.reshape(-1)[tail].tolist()} where "
                "the padding goes: the padding must be zeros (they enter the gradients' sums "
                "and Adam's states, and never reach the parameter)")
            assert_close(piece.reshape(-1), expected, f"shard of {where}", rank=rank,
                         against=f"elements {rank * size}..{(rank + 1) * size - 1} of the "
                                 "padded flat parameter",
                         likely_cause=f"rank r owns the r-th of N equal pieces, from element "
                                      f"r x {size}", **TOLERANCE)


def test_zero_shards_are_padded_to_equal_pieces(impl, run_alone):
    check_shards(impl, run_alone, SHARD_CASES)


# ----------------------------------------------------------------- on every rank

class UnequalPieces(RuntimeError):
    """A collective given pieces of unequal sizes: refused here, before the backend, which
    may wait for ever on such a call."""


class CollectiveLog(CommTracer):
    """Every collective of this rank, as data: its kind, its ranks, the sizes of the pieces
    it cuts or fills (with the rank's own piece), and the phase of the run (``phase[0]``).
    A call with pieces of unequal sizes is recorded and refused (:class:`UnequalPieces`)."""

    def __init__(self, phase: list):
        super().__init__()
        self.phase, self.entries = phase, []

    def _wrap(self, op, argument, original):
        signature = inspect.signature(original)

        def logged(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs).arguments
            group = bound.get("group") or dist.group.WORLD
            tensors = list(bound.values())[:2]  # a collective's list of pieces, its own one
            pieces = next((t for t in tensors if isinstance(t, (list, tuple))), None)
            own = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
            entry = {
                "op": op, "phase": self.phase[0], "ranks": dist.get_process_group_ranks(group),
                "pieces": [t.numel() for t in pieces] if pieces is not None else [],
                "own": own.numel() if pieces is not None and own is not None else None,
                "nbytes": payload_bytes(list(bound.values())[argument])}
            self.entries.append(entry)
            if unequal(entry):
                raise UnequalPieces(f"{op} given pieces of {entry['pieces']} elements")
            return original(*args, **kwargs)

        return logged


def payload_bytes(tensors) -> int:
    """A collective's payload as ``comm_trace`` counts it (a tensor, or a list of them)."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(payload_bytes(t) for t in tensors)


def unequal(call) -> bool:
    """Whether a collective's pieces (its own one included) differ in size."""
    own = [call["own"]] if call["own"] is not None else []
    return len(set(call["pieces"] + own)) > 1


def zero_on_rank(impl, stage: int, seed: int):
    """Every layout of the sweep, one after the other, on this rank: {case label: result}."""
    rank = dist.get_rank()
    handles = {}
    for dp, name, groups in layouts(seed):  # every rank creates every group, in one order
        made = [dist.new_group(ranks) for ranks in groups]
        handles[(dp, name)] = made[groups.index(group_of(rank, groups))]
    found = {}
    for dp, name, groups in layouts(seed):
        members = group_of(rank, groups)
        replica = (groups.index(members), members.index(rank))
        found[label(case_of(stage, dp, name), seed)] = zero_run(
            impl, stage, handles[(dp, name)], replica, members)
    dp, name, groups = bf16_layout(seed)
    members = group_of(rank, groups)
    found[label(case_of(stage, dp, name, "bf16"), seed)] = zero_run(
        impl, stage, handles[(dp, name)], (groups.index(members), members.index(rank)), members,
        torch.bfloat16)
    return found


def bf16_layout(seed: int):
    """The layout the bf16 case trains on: groups of 2, not consecutive."""
    return next(layout for layout in layouts(seed)
                if layout[0] == DP_SIZES[0] and layout[1] != "consecutive")


def zero_run(impl, stage, group, replica, members, dtype=torch.float32):
    phase = ["construction"]
    model = zero_model().to(current_device(), dtype)
    result = {"replica": list(replica), "error": None, "memory": None, "dp_ranks": members,
              "steps": []}
    with CollectiveLog(phase) as log:  # recording before the submission runs in this process
        result["error"] = train_zero(impl, stage, model, group, replica, phase, result)
    result["calls"] = log.entries
    return result


def shard_state(optimizer, model, stage) -> dict:
    """What this rank holds after a step: every shard's gradient (before the step: read by
    the caller), m, v and step count, and the whole parameters."""
    shards = [optimizer.shards[p] for p in model.parameters()]
    params = (optimizer.full_state_dict() if stage == 3 else
              {name: p.detach().clone() for name, p in model.named_parameters()})
    return {"exp_avg": [s.exp_avg.detach().cpu().clone() for s in shards],
            "exp_avg_sq": [s.exp_avg_sq.detach().cpu().clone() for s in shards],
            "count": [int(s.step) for s in shards],
            "params": {name: value.detach().cpu().clone() for name, value in params.items()}}


def gradients_now(optimizer, model) -> dict:
    """param.grad and the shard's gradient of every parameter, as they are."""
    def copy(tensor):
        return None if tensor is None else tensor.detach().cpu().clone()
    return {"param": [copy(p.grad) for p in model.parameters()],
            "shard": [copy(optimizer.shards[p].grad) for p in model.parameters()]}


def train_zero(impl, stage, model, dp_group, replica, phase, result):
    """ZeRO-``stage`` AdamW training of ``model`` over ``dp_group``; what it finds goes into
    ``result``. Returns the exception it raised, as text, or None."""
    device, dtype = current_device(), next(model.parameters()).dtype
    try:
        zero = impl.module("zero")
        optimizer = zero.ZeroOptimizer(model, dp_group, stage=stage, lr=LR, eps=EPS,
                                       decoupled_weight_decay=True,
                                       param_groups=decay_groups(model))
        for step in range(STEPS):
            if step == 1:
                for group in optimizer.param_groups:
                    group["lr"] = LR_AFTER_FIRST_STEP
            for micro in range(MICRO):
                phase[0] = f"step {step}, micro-batch {micro}"
                x, upstream = (t.to(device, dtype) for t in zero_batch(step, *replica, micro))
                model(x).backward(upstream)
            if step == 0:
                result["memory"] = {kind: int(value) for kind, value in
                                    zero.model_state_bytes(model, optimizer).items()}
            phase[0] = f"step {step}, reduce_gradients()"
            optimizer.reduce_gradients()
            grads = gradients_now(optimizer, model)
            phase[0] = f"step {step}, step()"
            optimizer.step()
            phase[0] = f"step {step}, reading the state"
            result["steps"].append({"grads": grads, **shard_state(optimizer, model, stage)})
            optimizer.zero_grad()
        optimizer.remove_hooks()
    except Exception as error:  # the test names it, with what the collectives show
        return f"{type(error).__name__}: {error}"
    return None


# ----------------------------------------------------------------- in the test: unsharded AdamW

def replicas_batch(replicas, scale, micros):
    """The batches of ``replicas`` [(group, member)], micro-batches ``micros`` in one, the
    output gradient times ``scale``: one device's version of their accumulated gradients."""
    def batch(step, index):
        pieces = [zero_batch(step, *replicas[index], micro) for micro in micros]
        return (torch.cat([x for x, _ in pieces]),
                scale * torch.cat([upstream for _, upstream in pieces]))
    return batch


@functools.lru_cache(maxsize=None)
def unsharded_adamw(replicas: tuple, scale=1.0, micros=tuple(range(MICRO))) -> list[dict]:
    """torch.optim.AdamW on a fresh model, STEPS steps on the gradients averaged over
    ``replicas`` (the lr halved after the first); per step: the averaged gradients, each
    replica's own, m, v and the parameters after it, by parameter index / name."""
    model = zero_model()
    optimizer = torch.optim.AdamW(decay_groups(model), lr=LR, eps=EPS, foreach=False)
    batch, records = replicas_batch(list(replicas), scale, micros), []
    for step in range(STEPS):
        if step == 1:
            for group in optimizer.param_groups:
                group["lr"] = LR_AFTER_FIRST_STEP
        own = []
        for index in range(len(replicas)):
            model.zero_grad()
            x, upstream = batch(step, index)
            model(x).backward(upstream)
            own.append([p.grad.clone() for p in model.parameters()])
        for index, p in enumerate(model.parameters()):
            p.grad = sum(grads[index] for grads in own) / len(replicas)
        mean = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        states = [optimizer.state[p] for p in model.parameters()]
        records.append({"mean": mean, "own": own,
                        "exp_avg": [s["exp_avg"].clone() for s in states],
                        "exp_avg_sq": [s["exp_avg_sq"].clone() for s in states],
                        "params": {n: p.detach().clone() for n, p in model.named_parameters()}})
    return records


def recorded_slice(tensor, member, members):
    """Rank ``member``'s shard of ``tensor``, by the elements lab 5's snapshot records that it
    owns (zeros where the padding goes)."""
    owned = snapshot("lab5", "owners")[f"{tensor.numel()}/{members}"][member]
    flat = tensor.reshape(-1)
    return torch.where(owned >= 0, flat[owned.clamp(min=0)], torch.zeros((), dtype=flat.dtype))


def usual_mistakes(group, member, members, stage) -> dict:
    """{what the student did: its records}, each trained on one device."""
    own = tuple((group, m) for m in range(members))
    world = tuple((g, m) for g in range(WORLD // members) for m in range(members))
    mistakes = {
        f"averaged over the world size: the group's sum divided by {WORLD}, not by the group's "
        f"size {members} ({members / WORLD:g}x the group's mean)": (own, members / WORLD),
        "all-reduced over the world instead of the group: both groups' batches summed, divided "
        f"by the group's size ({WORLD // members}x the world's mean)": (world, WORLD / members),
        "all-reduced over the world instead of the group and averaged over the world size: "
        "the mean of both groups' batches, not the group's": (world, 1.0),
        f"the gradient summed over the group but not averaged ({members}x the group's "
        "mean): divide by the group's size": (own, float(members)),
        "the gradient not reduced at all: each rank stepped on its own samples' gradient":
            (((group, member),), 1.0),
        f"averaged twice: the group's mean divided by the group's size {members} once more (an "
        "all-reduce with ReduceOp.AVG already averages; divide the sum once)":
            (own, 1.0 / members),
    }
    found = {description: unsharded_adamw(replicas, scale)
             for description, (replicas, scale) in mistakes.items() if replicas != own
             or scale != 1.0}
    if stage >= 2:
        found["only the last micro-batch's gradient kept: a new shard replaced what an earlier "
              "backward left; ZeRO accumulates into the gradient shard until zero_grad"] = \
            unsharded_adamw(own, micros=(MICRO - 1,))
    return found


# ----------------------------------------------------------------- in the test: the checks

def collective_evidence(rank, result, stage, where):
    """A named mistake from the collectives the rank ran, or None."""
    dp_ranks = result["dp_ranks"]
    for index, call in enumerate(result["calls"]):
        at = f"{where}, rank {rank}: {call['op']} #{index} ({call['phase']})"
        if call["ranks"] != dp_ranks:
            over = ("the world instead of the group" if len(call["ranks"]) == WORLD
                    else "the wrong group")
            return (f"{at} ran over ranks {call['ranks']}, not the optimizer's data-parallel "
                    f"group {dp_ranks}: {ACTION.get(call['op'], call['op'])} over {over} (the "
                    "data-parallel groups each have their own batches; pass the optimizer's "
                    "group to every collective)")
        if unequal(call):
            return (f"{at} was given pieces of {call['pieces']} elements and this rank's "
                    f"own piece of {call['own']}: a parameter cut without padding. Every "
                    f"piece must have the same size, ceil(numel / N): pad the flattened "
                    f"parameter with zeros to a multiple of the group's size {len(dp_ranks)} "
                    "first")
        if stage >= 2 and call["op"] == "all_reduce" and "micro-batch" in call["phase"]:
            return (f"{at}: ZeRO-{stage} all-reduced a whole gradient in the backward; it "
                    "reduce-scatters it instead, so that each rank receives only its shard of "
                    "the sum, half of an all-reduce's bytes (an all-reduce is a reduce-scatter "
                    "plus an all-gather)")
    return None


def phase_contract(stage, phase, ranks) -> list[dict]:
    """The operations ZeRO-``stage`` makes in one phase of a step, per the lab's formula."""
    padded = [-(-p.numel() // len(ranks)) * len(ranks) * 4 for p in zero_model().parameters()]
    gather = [expected("all_gather", ranks, n) for n in padded]
    scatter = [expected("reduce_scatter", ranks, n) for n in padded]
    if phase.endswith("reduce_gradients()"):
        return ([expected("all_reduce", ranks, p.numel() * 4) for p in zero_model().parameters()]
                if stage == 1 else [])
    if phase.endswith("step()"):
        return gather if stage < 3 else []
    return {1: [], 2: scatter, 3: gather + gather + scatter}[stage]


FORMULA = {1: "backward nothing; reduce_gradients one all-reduce of each whole gradient; step one "
              "all-gather of each padded parameter",
           2: "each backward one reduce-scatter of each padded gradient; reduce_gradients "
              "nothing; step one all-gather of each padded parameter",
           3: "each micro-batch one all-gather of each padded parameter before its forward and "
              "one before its backward, one reduce-scatter of each padded gradient; step nothing"}


def check_contracts(rank, result, stage, where):
    phases = [f"step {s}, {p}" for s in range(STEPS)
              for p in [f"micro-batch {m}" for m in range(MICRO)] + ["reduce_gradients()", "step()"]]
    for phase in phases:
        calls = [{"op": SAME_OPERATION.get(c["op"], c["op"]), "ranks": c["ranks"],
                  "nbytes": c["nbytes"], "peer": None}
                 for c in result["calls"] if c["phase"] == phase]
        check_contract(calls, phase_contract(stage, phase, result["dp_ranks"]),
                       f"ZeRO-{stage}, {phase} [{where}]", rank=rank, formula=FORMULA[stage])


def check_memory(rank, result, stage, members, where):
    numels = [p.numel() for p in zero_model().parameters()]
    psi, padded = sum(numels), sum(-(-n // members) * members for n in numels)
    formula = zero_memory_formula(psi, members, stage, mixed_precision=False,
                                  padded_num_params=padded)
    kept = {1: "m and v", 2: "m, v and the gradient", 3: "m, v, the gradient and the parameter"}
    assert result["memory"]["total"] == formula, (
        f"[{where}] rank {rank}: ZeRO-{stage} holds {result['memory']} bytes of model states "
        f"after the backward; the fp32 formula gives {formula} ({psi} parameters, {padded} after "
        f"padding each to a multiple of N = {members}): does each rank keep {kept[stage]} for "
        "its shard only?" + (f" {STAGE3_WHOLE}" if stage == 3 else ""))


def gradient_mistakes(result, stage, step, index) -> dict:
    """{known mistake: the mean gradient it gives}, at this step, for one parameter."""
    group, member = result["replica"]
    members = len(result["dp_ranks"])
    return {description: records[step]["mean"][index] for description, records
            in usual_mistakes(group, member, members, stage).items()}


def check_gradients(rank, result, stage, step, right, where):
    """reduce_gradients() alone: param.grad and the shards' gradients after it."""
    member, members = result["replica"][1], len(result["dp_ranks"])
    grads = result["steps"][step]["grads"]
    names = [name for name, _ in zero_model().named_parameters()]
    for index, name in enumerate(names):
        reduced_by = "reduce_gradients()" if stage == 1 else "the backward's _reduce_scatter"
        what = f"the gradient reduction ({reduced_by}), step {step}: {name}"
        mean, own = right[step]["mean"][index], right[step]["own"][member][index]
        mistakes = gradient_mistakes(result, stage, step, index)
        actual = grads["param"][index]
        if stage == 1:
            assert actual is not None, (
                f"[{where}] rank {rank}: {what}: param.grad is None after ZeRO-1's "
                "reduce_gradients: leave the group's mean in param.grad, as DDP does")
            assert_close_naming(actual, mean, f"[{where}] {what}: param.grad", rank=rank,
                                against="the gradient averaged over the data-parallel group",
                                mistakes={AVERAGED_A_COPY: own, **mistakes},
                                otherwise="param.grad must be the group's mean", **TOLERANCE)
        else:
            assert actual is None, (
                f"[{where}] rank {rank}: {what}: after the backward, param.grad still holds a "
                f"whole gradient: the full gradient kept; ZeRO-{stage} reduce-scatters each "
                "gradient as soon as it is ready (during the backward) and keeps only this "
                "rank's shard of it")
        shard = grads["shard"][index]
        assert shard is not None, (
            f"[{where}] rank {rank}: {what}: the shard's gradient (shards[param].grad) is None "
            f"after reduce_gradients(); ZeRO-{stage} keeps this rank's shard of the mean there")
        assert_close_naming(
            shard.reshape(-1), recorded_slice(mean, member, members),
            f"[{where}] {what}: this rank's gradient shard", rank=rank,
            against=f"shard {member} of the group's mean gradient, padded",
            mistakes={cause: recorded_slice(value, member, members)
                      for cause, value in mistakes.items()},
            otherwise="the shard must be this rank's piece of the padded flat mean: a shard "
                      "updated with another slice of the gradient?", **TOLERANCE)


def check_adam_state(rank, result, stage, step, right, where):
    member, members = result["replica"][1], len(result["dp_ranks"])
    state = result["steps"][step]
    names = [name for name, _ in zero_model().named_parameters()]
    for index, name in enumerate(names):
        assert state["count"][index] == step + 1, (
            f"[{where}] rank {rank}: step(), step {step}: {name}'s shard counts "
            f"{state['count'][index]} steps, not {step + 1}: Adam's bias correction reads it")
        for kind in ("exp_avg", "exp_avg_sq"):
            assert_close(state[kind][index].reshape(-1),
                         recorded_slice(right[step][kind][index], member, members),
                         f"[{where}] step(), step {step}: {name}'s {kind}", rank=rank,
                         against=f"shard {member} of torch.optim.AdamW's {kind}",
                         likely_cause="the gradients were right (reduce_gradients): is this "
                                      "shard's m or v updated with its own gradient shard, once "
                                      "per step?", **TOLERANCE)


def check_parameters(rank, result, stage, step, right, where):
    group, member = result["replica"]
    members = len(result["dp_ranks"])
    initial = dict(zero_model().named_parameters())
    for name, value in right[step]["params"].items():
        actual = result["steps"][step]["params"][name]
        if actual.shape == value.shape and torch.allclose(actual, value, **TOLERANCE):
            continue
        cause = next((description for description, records
                      in usual_mistakes(group, member, members, stage).items()
                      if torch.allclose(actual, records[step]["params"][name], **TOLERANCE)),
                     None) or shard_evidence(actual, value, initial[name].detach(), member,
                                             members)
        assert_close(actual, value, f"[{where}] ZeRO-{stage} parameter {name} after step() "
                     f"{step}", rank=rank, against="unsharded torch.optim.AdamW on the group's "
                     "averaged gradients", likely_cause=cause, **TOLERANCE)


def shard_evidence(actual, expected_value, initial, member, members):
    """Which shards of a parameter are wrong, and what that suggests."""
    actual, expected_value, initial = (t.reshape(-1).double()
                                       for t in (actual, expected_value, initial))
    if actual.numel() != expected_value.numel():
        return f"the parameter has {actual.numel()} elements, not {expected_value.numel()}"
    size = -(-actual.numel() // members)
    wrong = ~torch.isclose(actual, expected_value, **TOLERANCE)
    shards = sorted({int(i) // size for i in wrong.nonzero().reshape(-1)})
    where = f"shards {shards} of {members} ({size} elements each; this rank owns shard {member})"
    if member not in shards and torch.allclose(actual[wrong], initial[wrong], **TOLERANCE):
        return (f"{where} still hold their initial values, this rank's own shard is right: the "
                "other ranks' updated shards never reached this rank's parameter (all-gathered "
                "and copied back?)")
    rest = "the others right" if len(shards) < members else "every shard"
    return (f"{where} are wrong, {rest}: a shard updated with another slice of the gradient, m "
            "or v, or written back at another place?")


def check_run(rank, result, stage, where):
    members = len(result["dp_ranks"])
    evidence = collective_evidence(rank, result, stage, where)
    assert evidence is None, evidence
    assert result["error"] is None, (
        f"[{where}] rank {rank}: ZeRO-{stage} on the data-parallel group {result['dp_ranks']} "
        f"raised {result['error']}" + (f". {STAGE3_WHOLE}" if stage == 3 else ""))
    right = unsharded_adamw(tuple((result["replica"][0], m) for m in range(members)))
    for step in range(STEPS):
        check_gradients(rank, result, stage, step, right, where)
        check_adam_state(rank, result, stage, step, right, where)
        check_parameters(rank, result, stage, step, right, where)
    check_memory(rank, result, stage, members, where)
    check_contracts(rank, result, stage, where)


BF16_TOLERANCE = dict(atol=3e-2, rtol=3e-2)  # bf16 weights, m and v against fp32 AdamW


def check_bf16_run(rank, result, stage, where):
    """bf16 parameters: the run ends, every parameter stays bf16 and near fp32 AdamW's."""
    assert result["error"] is None, (
        f"[{where}] rank {rank}: ZeRO-{stage} with bf16 parameters raised {result['error']}. "
        "Likely cause: a tensor made for a parameter (a shard, a buffer to gather or reduce "
        "into) in the default dtype (float32) or on the default device instead of the "
        "parameter's")
    right = unsharded_adamw(tuple((result["replica"][0], m) for m in range(len(result["dp_ranks"]))))
    for name, value in right[-1]["params"].items():
        actual = result["steps"][-1]["params"][name]
        assert actual.dtype == torch.bfloat16, (
            f"[{where}] rank {rank}: ZeRO-{stage} parameter {name} is {actual.dtype} after "
            f"{STEPS} steps, the model's parameters bf16: the step keeps each parameter's dtype")
        assert_close(actual.float(), value, f"[{where}] ZeRO-{stage} parameter {name} after "
                     f"{STEPS} steps", rank=rank, against="fp32 torch.optim.AdamW",
                     likely_cause="the fp32 case passes: a bf16 path of its own (a dtype "
                     "taken from somewhere other than the parameter?)", **BF16_TOLERANCE)


def launched(run_on_ranks, impl, stage, seed):
    """Every rank's results; a rank killed by a signal (a write into freed storage: Python
    cannot catch it) is named."""
    try:
        return run_on_ranks(zero_on_rank, WORLD, impl, stage, seed, timeout=TIMEOUT)
    except RankFailure as failure:
        if stage != 3 or "killed by signal" not in str(failure):
            raise
        raise AssertionError(
            f"ZeRO-3 [{label(case_of(stage, DP_SIZES[0], 'consecutive'), seed)} and the rest of "
            f"the sweep]: {str(failure).splitlines()[0]}. Likely cause: stage 3 wrote into a "
            f"parameter whose storage is freed (0 bytes between layers), e.g. step() copied the "
            f"updated shards back into the parameter as stages 1 and 2 do: {STAGE3_WHOLE}"
        ) from None


@pytest.mark.parametrize("stage", [1, 2, 3], ids=["zero1", "zero2", "zero3"])
def test_zero_on_two_groups_matches_unsharded_adam(impl, run_on_ranks, sweep_seed, stage):
    results = launched(run_on_ranks, impl, stage, sweep_seed)
    # the world first: where the group is the world, dividing by the world's size is right and
    # averaging twice is not, while on groups of 2 of 4 ranks both halve the mean
    for dp, name, _ in sorted(layouts(sweep_seed), key=lambda layout: -layout[0]):
        where = label(case_of(stage, dp, name), sweep_seed)
        for rank, found in enumerate(results):
            check_run(rank, found[where], stage, where)
    dp, name, _ = bf16_layout(sweep_seed)
    where = label(case_of(stage, dp, name, "bf16"), sweep_seed)
    for rank, found in enumerate(results):
        check_bf16_run(rank, found[where], stage, where)


# ------------------------------------------- a parameter that gets no gradient in a step

class SometimesUnused(nn.Module):
    """Two layers, and a third that only odd steps use: in step 0 its parameters get no
    gradient (``grad`` None), as a layer skipped by a branch or a frozen expert's would."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.last, self.branch = (nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN),
                                              nn.Linear(FFN, FFN))

    def forward(self, x, step: int):
        hidden = torch.tanh(self.first(x))
        if step % 2:
            hidden = hidden + torch.tanh(self.branch(hidden))
        return self.last(hidden)


UNUSED_STEPS = 2


def unused_on_rank(impl, stage: int):
    """Two ZeRO steps of ``SometimesUnused`` on the world (2 ranks), the branch unused in the
    first: every parameter after each step, or the exception raised, with its step."""
    model = SometimesUnused()
    zero = impl.module("zero").ZeroOptimizer(model, stage=stage, lr=LR, eps=EPS)
    found = []
    for step in range(UNUSED_STEPS):
        try:
            x, upstream = zero_batch(step, 0, dist.get_rank(), 0)
            model(x, step).backward(upstream)
            zero.step()
            zero.zero_grad()
            found.append({name: value.detach().clone()
                          for name, value in zero.full_state_dict().items()})
        except Exception as error:  # named in the test with the step and the function
            function = raised_in(error, "zero.py")
            inside = f" in ZeroOptimizer's {function}" if function else ""
            return found, f"step {step}{inside}: {type(error).__name__}: {error}"
    return found, None


def unused_with_torch() -> list[dict]:
    """The same two steps with torch's Adam on the two ranks' mean gradient."""
    model = SometimesUnused()
    adam = torch.optim.Adam(model.parameters(), lr=LR, eps=EPS)
    found = []
    for step in range(UNUSED_STEPS):
        for member in range(2):
            x, upstream = zero_batch(step, 0, member, 0)
            (model(x, step) * upstream / 2).sum().backward()
        adam.step()
        adam.zero_grad()
        found.append({name: value.detach().clone() for name, value in model.named_parameters()})
    return found


@pytest.mark.parametrize("stage", [1, 2, 3], ids=["zero1", "zero2", "zero3"])
def test_zero_steps_a_parameter_that_got_no_gradient(impl, run_on_ranks, stage):
    """A parameter whose gradient is None in a step keeps its weights and its Adam state (torch
    skips it), and is updated as its first step when it next gets one."""
    results = run_on_ranks(unused_on_rank, 2, impl, stage, timeout=TIMEOUT)
    expected = unused_with_torch()
    for rank, (found, raised) in enumerate(results):
        where = f"ZeRO-{stage}, 2 ranks, the branch unused in step 0, rank {rank}"
        assert raised is None, (f"{where}: {raised}: a parameter that got no gradient in a step "
                                "has none to reduce or to step with")
        for step, (mine, right) in enumerate(zip(found, expected)):
            for name, value in right.items():
                assert_close(mine[name], value, f"{where}, {name} after step {step}",
                             likely_cause=("a parameter that got no gradient must keep its "
                                           "weights and its Adam state (step count included) "
                                           "until it gets one" if "branch" in name else ""),
                             **TOLERANCE)
