"""Lab 5, graded: ZeRO (``zero.py``, Rajbhandari et al. 2020): the padded shards, ZeRO-1's
step and ZeRO-2's reduce-scatter of the gradients.

* **Shards** (one process, no communication): for parameters of 5, 10, 12 and 35
  elements over N = 2, 3 and 4 ranks, every rank's ``my_slice`` against the flattened
  parameter padded with zeros to N * ceil(numel / N) and cut in N.
* **Training on two data-parallel groups at once**: 4 CPU ranks in Megatron's layout with
  tp = 2, so two RDP groups of 2 ranks ({0, 2} and {1, 3}), neither of them the world. Each
  group trains its own batches, so a collective over the world, or a mean over the world
  size, gives other numbers. Every parameter has an odd number of elements (hidden 5, FFN 7),
  so no parameter divides into 2 equal shards without padding. Each step accumulates two
  micro-batches before the optimizer steps. After 3 steps every rank's parameters must be those
  of unsharded ``torch.optim.Adam`` on its group's averaged gradients, computed here in
  pytest's process from a fresh model the submission never saw; after the first backward
  each rank holds the fp32 formula's bytes of model states (ZeRO-1 8 + 8/N, ZeRO-2 4 + 12/N
  bytes per parameter, each parameter padded to a multiple of N).

Before the submission is loaded, each rank starts recording every collective (its kind, its
ranks, the sizes of its pieces, the phase of the run it came in), and the run catches an
exception rather than dying, so that a failure is named from what the ranks did: a
collective over the world, pieces of unequal size (a parameter cut without padding), an
all-reduce of the whole gradient in ZeRO-2's backward. Where the parameters are wrong, the
test compares them with the results of the usual mistakes (averaged over the world size,
summed over the world, not averaged, not reduced, micro-batches overwritten), each trained
here too, and otherwise says which shards are wrong.

Adam's update g / (sqrt(v) + eps) ignores the gradient's scale when eps is tiny: a gradient
summed instead of averaged would pass. With eps = 1 the scale shows. Tolerance (fp32): 1e-6
absolute and relative (Adam's own arithmetic per element; only the order of sums changes).
"""
import inspect
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.groups import build_rank_layout
from reference_impl.comm.device import current_device
from reference_impl.comm.process_groups import create_process_groups
from reference_impl.equivalence import train_on_averaged_gradients
from reference_impl.model import MLP

pytestmark = pytest.mark.lab5

WORLD, TP, HIDDEN, FFN = 4, 2, 5, 7  # 5, 7 and 35 elements: none divides by the group's 2
STEPS, MICRO, LR, EPS = 3, 2, 1e-2, 1.0
TOLERANCE = dict(atol=1e-6, rtol=1e-6)
TIMEOUT = 120
ACTION = {"all_reduce": "all-reduced", "all_gather": "all-gathered",
          "all_gather_into_tensor": "all-gathered", "reduce_scatter": "reduce-scattered",
          "reduce_scatter_tensor": "reduce-scattered"}


def zero_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(HIDDEN), MLP(HIDDEN, FFN), nn.LayerNorm(HIDDEN))


def zero_batch(step: int, group: int, member: int, micro: int):
    """Micro-batch ``micro`` of step ``step`` for rank ``member`` of data-parallel group
    ``group``: (input, the gradient of the output)."""
    generator = torch.Generator().manual_seed(1000 * step + 100 * group + 10 * micro + member)
    return (torch.randn(2, 3, HIDDEN, generator=generator),
            torch.randn(2, 3, HIDDEN, generator=generator))


# ----------------------------------------------------------------- the shards, alone

SHARD_CASES = [((5,), 2), ((7, 5), 2), ((2, 5), 4), ((12,), 4), ((5,), 3)]


def slices_alone(impl):
    """Every rank's ``my_slice`` of a parameter 1, 2, ..., numel, for every case."""
    zero = impl.module("zero")
    found = {}
    for shape, n in SHARD_CASES:
        param = nn.Parameter(torch.arange(1.0, math.prod(shape) + 1).reshape(shape))
        pieces = []
        for rank in range(n):
            try:
                pieces.append(zero._ShardedParameter(param, n, rank).my_slice(param).clone())
            except Exception as error:  # named in the test, with the case
                pieces.append(f"{type(error).__name__}: {error}")
        found[f"{shape}/{n}"] = pieces
    return found


def test_zero_shards_are_padded_to_equal_pieces(impl, run_alone):
    found = run_alone(slices_alone, impl)
    for shape, n in SHARD_CASES:
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
                "own": own.numel() if pieces is not None and own is not None else None}
            self.entries.append(entry)
            if unequal(entry):
                raise UnequalPieces(f"{op} given pieces of {entry['pieces']} elements")
            return original(*args, **kwargs)

        return logged


def unequal(call) -> bool:
    """Whether a collective's pieces (its own one included) differ in size."""
    own = [call["own"]] if call["own"] is not None else []
    return len(set(call["pieces"] + own)) > 1


def zero_on_rank(impl, stage: int):
    device = current_device()
    groups = create_process_groups(build_rank_layout(WORLD, tp=TP, pp=1, order="megatron"))
    group, member = groups.coordinates.tp_rank, groups.coordinates.rdp_rank
    phase = ["construction"]
    model = zero_model().to(device)
    result = {"group": group, "member": member, "error": None, "memory": None,
              "dp_ranks": dist.get_process_group_ranks(groups.rdp), "whole_gradients": None,
              "params": []}  # after each step
    with CollectiveLog(phase) as log:  # recording before the submission runs in this process
        result["error"] = train_zero(impl, stage, model, groups.rdp, (group, member), phase,
                                     result)
    result["calls"] = log.entries
    return result


def train_zero(impl, stage, model, dp_group, replica, phase, result):
    """ZeRO-``stage`` training of ``model`` over ``dp_group``; what it finds goes into
    ``result``. Returns the exception it raised, as text, or None."""
    device = current_device()
    try:
        zero = impl.module("zero")
        optimizer = zero.ZeroOptimizer(model, dp_group, stage=stage, lr=LR, eps=EPS)
        for step in range(STEPS):
            for micro in range(MICRO):
                phase[0] = f"step {step}, backward of micro-batch {micro}"
                x, upstream = (t.to(device) for t in zero_batch(step, *replica, micro))
                model(x).backward(upstream)
            if step == 0:
                result["whole_gradients"] = [name for name, p in model.named_parameters()
                                             if p.grad is not None]
                result["memory"] = {kind: int(value) for kind, value in
                                    zero.model_state_bytes(model, optimizer).items()}
            phase[0] = f"step {step}, optimizer.step()"
            optimizer.step()
            optimizer.zero_grad()
            result["params"].append({name: p.detach().cpu().clone()
                                     for name, p in model.named_parameters()})
    except Exception as error:  # the test names it, with what the collectives show
        return f"{type(error).__name__}: {error}"
    return None


# ----------------------------------------------------------------- in the test

def collective_evidence(rank, result, stage):
    """A named mistake from the collectives the rank ran, or None."""
    dp_ranks = result["dp_ranks"]
    for index, call in enumerate(result["calls"]):
        where = f"rank {rank}: {call['op']} #{index} ({call['phase']})"
        if call["ranks"] != dp_ranks:
            over = ("the world instead of the group" if len(call["ranks"]) == WORLD
                    else "the wrong group")
            return (f"{where} ran over ranks {call['ranks']}, not the optimizer's data-parallel "
                    f"group {dp_ranks}: {ACTION.get(call['op'], call['op'])} over {over} (there are two "
                    "data-parallel groups, each with its own batches; pass the optimizer's "
                    "group to every collective)")
        if unequal(call):
            return (f"{where} was given pieces of {call['pieces']} elements and this rank's "
                    f"own piece of {call['own']}: a parameter cut without padding. Every "
                    f"piece must have the same size, ceil(numel / N): pad the flattened "
                    f"parameter with zeros to a multiple of the group's size {len(dp_ranks)} "
                    "first")
        if stage == 2 and call["op"] == "all_reduce" and "backward" in call["phase"]:
            return (f"{where}: ZeRO-2 all-reduced a whole gradient in the backward; it "
                    "reduce-scatters it instead, so that each rank receives only its shard of "
                    "the sum, half of an all-reduce's bytes (an all-reduce is a reduce-scatter "
                    "plus an all-gather)")
    return None


def replicas_batch(replicas, scale, micros):
    """The batches of ``replicas`` [(group, member)], micro-batches ``micros`` in one, the
    output gradient times ``scale``: one device's version of their accumulated gradients."""
    def batch(step, index):
        pieces = [zero_batch(step, *replicas[index], micro) for micro in micros]
        return (torch.cat([x for x, _ in pieces]),
                scale * torch.cat([upstream for _, upstream in pieces]))
    return batch


def unsharded_adam(replicas, steps=STEPS, scale=1.0, micros=tuple(range(MICRO))) -> dict:
    """torch.optim.Adam on a fresh model, ``steps`` steps on the gradients averaged over
    ``replicas``."""
    model = zero_model()
    return train_on_averaged_gradients(
        model, torch.optim.Adam(model.parameters(), lr=LR, eps=EPS), steps, len(replicas),
        replicas_batch(replicas, scale, micros))


def usual_mistakes(group, member, members, stage, steps):
    """{what the student did: the parameters it gives}, each trained on one device."""
    own = [(group, m) for m in range(members)]
    world = [(g, m) for g in range(WORLD // members) for m in range(members)]
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
            ([(group, member)], 1.0),
    }
    found = {description: unsharded_adam(replicas, steps, scale)
             for description, (replicas, scale) in mistakes.items()}
    if stage == 2:
        found["only the last micro-batch's gradient kept: a new shard replaced what an earlier "
              "backward left; ZeRO-2 accumulates into the gradient shard until zero_grad"] = \
            unsharded_adam(own, steps, micros=(MICRO - 1,))
    return found


def shard_evidence(actual, expected, initial, member, members):
    """Which shards of a parameter are wrong, and what that suggests."""
    actual, expected, initial = (t.reshape(-1).double() for t in (actual, expected, initial))
    size = -(-actual.numel() // members)
    wrong = ~torch.isclose(actual, expected, **TOLERANCE)
    shards = sorted({int(i) // size for i in wrong.nonzero().reshape(-1)})
    where = f"shards {shards} of {members} ({size} elements each; this rank owns shard {member})"
    if member not in shards and torch.allclose(actual[wrong], initial[wrong], **TOLERANCE):
        return (f"{where} still hold their initial values, this rank's own shard is right: the "
                "other ranks' updated shards never reached this rank's parameter (all-gathered "
                "and copied back?)")
    rest = "the others right" if len(shards) < members else "every shard"
    return (f"{where} are wrong, {rest}: a shard updated with another slice of the gradient, m "
            "or v, or written back at another place?")


def first_wrong(result, group, members):
    """(steps, name, actual, expected) of the first parameter off after the fewest steps, or
    None: a mistake shows most plainly at the first step it changes."""
    own = [(group, m) for m in range(members)]
    if all(torch.allclose(value.double(), result["params"][-1][name].double(), **TOLERANCE)
           for name, value in unsharded_adam(own).items()):
        return None
    for steps in range(1, STEPS + 1):
        for name, value in unsharded_adam(own, steps).items():
            actual = result["params"][steps - 1][name]
            if not torch.allclose(actual.double(), value.double(), **TOLERANCE):
                return steps, name, actual, value


def expected_bytes(stage, members):
    """fp32 ZeRO (Rajbhandari et al. 2020): parameter 4 + gradient 4 + Adam's m and v 8 bytes
    per parameter; stage 1 shards m and v, stage 2 the gradient too (each parameter padded to
    a multiple of N before it is cut)."""
    numels = [p.numel() for p in zero_model().parameters()]
    psi, padded = sum(numels), sum(-(-n // members) * members for n in numels)
    replicated, sharded = {1: (8, 8), 2: (4, 12)}[stage]
    return replicated * psi + sharded * padded // members, psi, padded


@pytest.mark.parametrize("stage", [1, 2], ids=["zero1", "zero2"])
def test_zero_on_two_groups_matches_unsharded_adam(impl, run_on_ranks, stage):
    results = run_on_ranks(zero_on_rank, WORLD, impl, stage, timeout=TIMEOUT)
    initial = dict(zero_model().named_parameters())
    for rank, result in enumerate(results):
        members = len(result["dp_ranks"])
        evidence = collective_evidence(rank, result, stage)
        assert evidence is None, evidence
        assert result["error"] is None, (
            f"rank {rank}: ZeRO-{stage} on the data-parallel group {result['dp_ranks']} "
            f"raised {result['error']}")
        if stage == 2:
            assert not result["whole_gradients"], (
                f"rank {rank}: after the backward, param.grad still holds the whole gradient of "
                f"{result['whole_gradients']}: the full gradient kept; ZeRO-2 reduce-scatters "
                "each gradient as soon as it is ready (during the backward) and keeps only this "
                "rank's shard of it")
        formula, psi, padded = expected_bytes(stage, members)
        assert result["memory"]["total"] == formula, (
            f"rank {rank}: ZeRO-{stage} holds {result['memory']} bytes of model states after "
            f"the backward; the fp32 formula gives {formula} ({psi} parameters, {padded} after "
            f"padding each to a multiple of N = {members}): does each rank keep "
            f"{'m, v and the gradient' if stage == 2 else 'm and v'} for its shard only?")
        wrong = first_wrong(result, result["group"], members)
        if wrong is None:
            continue
        steps, name, actual, value = wrong
        mistakes = usual_mistakes(result["group"], result["member"], members, stage, steps)
        cause = next((description for description, params in mistakes.items()
                      if torch.allclose(actual.double(), params[name].double(), **TOLERANCE)),
                     None) or shard_evidence(actual, value, initial[name].detach(),
                                             result["member"], members)
        assert_close(actual, value, f"ZeRO-{stage} parameter {name} after {steps} step(s) on "
                     f"the data-parallel group {result['dp_ranks']}", rank=rank,
                     against="unsharded torch.optim.Adam on the group's averaged gradients",
                     likely_cause=cause, **TOLERANCE)
