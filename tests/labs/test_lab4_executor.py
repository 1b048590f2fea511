"""Lab 4, graded: the executor's point-to-point layer (``post_exchange``) and its step
(``run_action``: one forward or backward of one stage, which frees what it no longer needs).

* ``run_action`` alone, in a helper process, on a two-stage toy model: what each action
  returns (the last stage sends nothing), the loss it records (scaled by 1/m), the entry the
  backward frees, the gradients it passes back and accumulates.
* ``run_action`` of ZB-H1 (the backward split into B and W): what ``saved`` and
  ``context.deferred`` hold after each of F, B and W (W frees both).
* One pipelined training step of a small GPT with the student's executor: every schedule it
  serves (naive, GPipe, 1F1B, interleaved 1F1B, ZB-H1) on 4 ranks or on two pipelines of 2
  ranks at once, every layout swept (``reference_impl.course.sweeps``: consecutive, strided,
  permuted; ``--sweep-seed N`` draws another): a pipeline group that is not the world, so a
  pipeline rank is not a global rank. Every message posted once, to its peer, with its tag and
  one microbatch's boundary bytes. The loss and every parameter's gradient must be the
  single-device GPT's (fp32, atol = rtol = 1e-5; observed within 3e-7), also with the GPT and
  its boundary tensors in fp64 (``run_schedule``'s ``boundary_dtype``: every tensor posted must
  be of that dtype), each rank must hold exactly the activations the schedule promises (naive:
  1, GPipe: m, 1F1B: what the simulator's ``peak_in_flight`` gives for the schedule, ZB-H1:
  min(p, m), interleaved: its warm-up plus one), and
  the messages each rank posted, recorded as it posted them, must not jam when a send waits
  for its receive (NCCL): ``check_rendezvous`` runs the recorded postings and names the cycle
  if a send and a receive were posted separately.

The schedules are written here as text (the tests of ``pipeline_schedules`` grade the student's
own), so this file grades the executor alone.
"""
import copy
import functools
import re
import zlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.comm.rank_failures import RankFailure
from reference_impl.course.sweeps import group_layouts
from reference_impl.model import GPT, ModelConfig
from reference_impl.pipeline.gpt_stages import gpt_pipeline_step
from reference_impl.pipeline.pipeline_messages import Exchange, exchange_plan, messages, normalized
from reference_impl.pipeline.pipeline_simulator import simulate
from reference_impl.pipeline.pipeline_validator import ScheduleError, check_rendezvous

pytestmark = pytest.mark.lab4

CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=2)
MICRO_BATCH, TOLERANCE = 2, dict(atol=1e-5, rtol=1e-5)

ROWS = {  # by hand from the definitions: GPipe all F then all B; 1F1B backward as early as it can
    ("gpipe", 4, 8): ["F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7"] * 4,
    ("1f1b", 4, 5): ["F0 F1 F2 F3 B0 F4 B1 B2 B3 B4", "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4",
                     "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4", "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4"],
    ("1f1b", 2, 4): ["F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"],
    ("naive", 4, 1): ["F0 B0"] * 4,
    # the kit's own generators (not exercises), as they print: ZB-H1 is 1F1B's F/B order with
    # each W after its B, rank r's first r postponed; interleaved puts stage s on rank s % p
    ("zb-h1", 2, 4): ["F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3",
                      "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3"],
    ("interleaved", 2, 4): ["F0s0 F1s0 F0s2 F1s2 F2s0 B0s2 F3s0 B1s2 F2s2 B0s0 F3s2 B1s0 B2s2 "
                            "B3s2 B2s0 B3s0",
                            "F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 F2s1 B0s1 F3s1 B1s1 F2s3 B2s3 F3s3 "
                            "B3s3 B2s1 B3s1"],
}


def promised_peak(name, schedule, rank):
    """The most (microbatch, stage) entries rank ``rank`` holds at once under the schedule, as
    the schedules' docstrings state it (``pipeline_schedules``, ``interleaved``), and the rule
    in words. An entry lives from its F to its B (to its W when the backward is split)."""
    p, m, v = schedule.ranks, schedule.microbatches, schedule.chunks
    if name == "naive":
        return 1, "1: one microbatch"
    if name == "gpipe":
        return m, "m"
    if name == "1f1b":
        return simulate(schedule).peak_in_flight[rank], "the schedule's peak, as the simulator counts it"
    if name == "zb-h1":
        return min(p, m), "min(p, m): held until W"
    if name == "interleaved":  # its warm-up forwards, then one more before the first backward
        return (min((v - 1) * p + 2 * (p - rank - 1) + 1, m * v),
                "min((v - 1)p + 2(p - r - 1) + 1, mv) chunks")
    raise ValueError(f"no promised peak for schedule {name!r}")


TOKEN = re.compile(r"([FBW])(\d+)(?:s(\d+))?$")  # F3, or F3s5 with the virtual stage


def as_data(rows, microbatches, name):
    """Rows of text as plain schedule data: one chunk unless a token names its stage, the
    backward split when a W appears."""
    actions = [[(kind, int(mb), rank if stage is None else int(stage))
                for kind, mb, stage in (TOKEN.match(token).groups() for token in row.split())]
               for rank, row in enumerate(rows)]
    stages = 1 + max(stage for ops in actions for _, _, stage in ops)
    return {"name": name, "ranks": len(rows), "microbatches": microbatches,
            "chunks": stages // len(rows),
            "split_backward": any(kind == "W" for ops in actions for kind, _, _ in ops),
            "actions": actions}


def as_schedule(data):
    """The kit's ``Schedule`` from plain data (``normalized`` rebuilds it with the kit's classes)."""
    actions = [[SimpleNamespace(kind=k, microbatch=mb, stage=s) for k, mb, s in ops]
               for ops in data["actions"]]
    return normalized(SimpleNamespace(**{**data, "actions": actions}))


# ---------------------------------------------------------------- run_action alone

def run_action_on_two_stages(impl):
    """F and B of microbatch 1 (of m = 2) through a two-stage toy model; what they return,
    record, keep and free, and the single-device values computed before the submission runs."""
    torch.manual_seed(0)
    first, last = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)
    x, target = torch.randn(2, 4), torch.tensor([0, 2])
    m = 2
    a, b = copy.deepcopy(first), copy.deepcopy(last)
    output = a(x)
    hidden = output.detach().requires_grad_()
    loss = F.cross_entropy(b(hidden), target)
    (loss / m).backward()
    torch.autograd.backward(output, hidden.grad)
    expected = {"hidden": hidden.detach(), "loss": loss.detach(), "gradient": hidden.grad,
                "first": [p.grad for p in a.parameters()],
                "last": [p.grad for p in b.parameters()]}

    executor = impl.module("pipeline_executor")
    action = impl.module("pipeline_schedules").Action
    context = executor.StepContext(microbatches=m, last_stage=1, split_backward=False,
                                   inputs=[torch.zeros(2, 4), x], targets=[None, target],
                                   loss_fn=F.cross_entropy)
    saved, found = {}, {}

    def run(kind, stage, module, received):
        """run_action of microbatch 1; an exception it raises is recorded with the action."""
        try:
            return executor.run_action(action(kind, 1, stage), module, received, saved, context)
        except Exception as error:  # named in the test, with the action that raised it
            found["raised"] = (f"{kind} of stage {stage}", f"{type(error).__name__}: {error}")
            raise

    try:
        sent = run("F", 0, first, None)
        found["F0"] = (sent.detach() if isinstance(sent, torch.Tensor) else None,
                       isinstance(sent, torch.Tensor) and sent.grad_fn is not None)
        sent_last = run("F", 1, last, sent)
        found["F1"] = repr(type(sent_last).__name__)
        recorded = context.losses.get(1)
        found["loss"] = None if recorded is None else recorded.detach().float()
        found["loss attached"] = isinstance(recorded, torch.Tensor) and recorded.requires_grad
        found["held"] = sorted(saved)
        gradient = run("B", 1, last, None)
        found["B1"] = gradient.detach() if isinstance(gradient, torch.Tensor) else None
        found["held after B1"] = sorted(saved)
        back = run("B", 0, first, gradient)
    except Exception:
        return found, expected
    found["B0"] = repr(type(back).__name__)
    found["held after B0"] = sorted(saved)
    found["first"] = [p.grad for p in first.parameters()]
    found["last"] = [p.grad for p in last.parameters()]
    return found, expected


def raised_in_run_action(found) -> None:
    """Fail naming the action of ``run_action`` that raised, and what its backward needs."""
    if "raised" not in found:
        return
    where, error = found["raised"]
    why = ""
    if "implicitly created only for scalar outputs" in error:
        why = (": a backward without a received gradient starts from a single number. Is what "
               "the last stage's forward kept for its backward its loss (divided by m), or its "
               "output?")
    pytest.fail(f"run_action({where}) raised {error}{why}", pytrace=False)


def test_run_action_returns_records_and_frees(impl, run_alone):
    found, expected = run_alone(run_action_on_two_stages, impl)
    raised_in_run_action(found)
    sent, attached = found["F0"]
    assert sent is not None, "the first stage's forward must return its output for stage 1"
    assert not attached, ("the forward returned its output still attached to the stage's graph: "
                          "return it detached; the next stage starts its own graph from it")
    assert_close(sent, expected["hidden"], "stage 0's forward output", **TOLERANCE)
    assert found["F1"] == "'NoneType'", (
        f"the last stage sends: its forward returned a {found['F1']}; nothing goes after the "
        f"last stage (its output is the loss, kept for its backward): return None")
    assert found["loss"] is not None, "the last stage's forward must record its loss in " \
                                      "context.losses[microbatch]"
    assert not found["loss attached"], (
        "run_action(F of stage 1) recorded its loss still attached to the stage's graph "
        "(requires_grad): context.losses holds numbers, the step's loss is their sum, and an "
        "attached one keeps the microbatch's graph alive after its backward")
    if torch.allclose(found["loss"], expected["loss"], atol=1e-6):
        pytest.fail(f"the loss is not scaled by 1/m: recorded {float(found['loss']):.6f}, the "
                    f"microbatch's whole loss; with m = 2 microbatches each contributes "
                    f"loss/m = {float(expected['loss']) / 2:.6f}, so that the gradients summed "
                    f"over the microbatches are those of the full batch's mean", pytrace=False)
    assert_close(found["loss"], expected["loss"] / 2, "the recorded loss (loss/m)",
                 likely_cause="the loss of the last stage, scaled by 1/m", **TOLERANCE)
    assert found["held"] == [(1, 0), (1, 1)], (
        f"after both forwards `saved` holds {found['held']}; each forward keeps its "
        f"(microbatch, stage) entry, [(1, 0), (1, 1)], for its backward")
    assert found["held after B1"] == [(1, 0)], (
        f"activation never freed: after the backward of microbatch 1 at stage 1, `saved` holds "
        f"{found['held after B1']}; the backward must drop its own entry, or under 1F1B the rank "
        f"holds as many microbatches at once as under GPipe")
    assert found["held after B0"] == [], (
        f"activation never freed: after the last backward `saved` still holds "
        f"{found['held after B0']}")
    assert found["B1"] is not None, "the last stage's backward must return the gradient of " \
                                    "its input, for stage 0"
    assert_close(found["B1"], expected["gradient"], "the gradient the last stage sends back",
                 likely_cause="backward from the scaled loss, then the input's .grad", **TOLERANCE)
    assert found["B0"] == "'NoneType'", (f"stage 0's backward returned a {found['B0']}: there is "
                                         f"no stage before it, return None")
    for which in ("first", "last"):
        for index, (got, want) in enumerate(zip(found[which], expected[which])):
            assert got is not None, f"the {which} stage's parameter {index} got no gradient"
            assert_close(got, want, f"the {which} stage's parameter {index} gradient",
                         likely_cause="backward from what the forward kept, with the received "
                                      "gradient; the loss scaled by 1/m", **TOLERANCE)


def split_backward_on_two_stages(impl):
    """ZB-H1's F, B and W of one microbatch through the same two stages, the backward split:
    what B returns and keeps, what ``saved`` and ``context.deferred`` hold after each action,
    the weight gradients after B and after W, and the single-device values computed before the
    submission runs."""
    from reference_impl.pipeline.split_backward import DeferredWeightGrads, weight_grads_deferred

    torch.manual_seed(0)
    first, last = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)
    x, target = torch.randn(2, 4), torch.tensor([0, 2])
    a, b = copy.deepcopy(first), copy.deepcopy(last)
    hidden = a(x).detach().requires_grad_()
    F.cross_entropy(b(hidden), target).backward()
    expected = {"gradient": hidden.grad, "last": [p.grad for p in b.parameters()]}

    executor = impl.module("pipeline_executor")
    action = impl.module("pipeline_schedules").Action
    context = executor.StepContext(microbatches=1, last_stage=1, split_backward=True,
                                   inputs=[hidden.detach()], targets=[target],
                                   loss_fn=F.cross_entropy)
    saved, found = {}, {}
    context.deferred[0, 1] = DeferredWeightGrads()
    with weight_grads_deferred(last, context.deferred[0, 1]):  # as run_schedule does
        executor.run_action(action("F", 0, 1), last, hidden.detach(), saved, context)
    found["held after F"] = sorted(saved)
    gradient = executor.run_action(action("B", 0, 1), last, None, saved, context)
    found["held after B"] = sorted(saved)
    found["B"] = gradient.detach() if isinstance(gradient, torch.Tensor) else None
    found["after B"] = [p.grad is not None and bool(p.grad.abs().sum() > 0)
                        for p in last.parameters()]
    kept = saved.get((0, 1))
    found["kept"] = ("freed" if kept is None else " and ".join(type(k).__name__ for k in kept))
    if kept is not None:
        executor.run_action(action("W", 0, 1), last, None, saved, context)
    found["held after W"] = sorted(saved)
    found["deferred after W"] = sorted(context.deferred)
    found["after W"] = [None if p.grad is None else p.grad.clone() for p in last.parameters()]
    return found, expected


def test_run_action_splits_the_backward_for_zero_bubble(impl, run_alone):
    found, expected = run_alone(split_backward_on_two_stages, impl)
    assert found["held after F"] == [(0, 1)], (
        f"after ZB-H1's F of microbatch 0 at stage 1, `saved` holds {found['held after F']}; "
        f"the forward keeps its (microbatch, stage) entry, [(0, 1)], for its B")
    assert found["B"] is not None, "the split backward (ZB-H1's B) must return the gradient of " \
                                   "the stage's input, as the whole backward does"
    assert_close(found["B"], expected["gradient"], "the input gradient of the split backward",
                 likely_cause="the same backward as the whole one, from the saved output",
                 **TOLERANCE)
    assert found["kept"] == "DeferredWeightGrads", (
        f"after the split backward (ZB-H1's B) the entry holds {found['kept']}: it keeps only "
        f"its weight gradients' store (context.deferred[key]) for its W, not the graph "
        f"(freed: W would find nothing)")
    assert found["held after B"] == [(0, 1)], (
        f"after ZB-H1's B of microbatch 0 at stage 1, `saved` holds {found['held after B']}; "
        f"with the backward split, B keeps the entry [(0, 1)] (its weight gradients' store) "
        f"for the W that follows")
    assert not any(found["after B"]), (
        "the split backward computed the weight gradients in B: with the backward split (ZB-H1) "
        "every linear layer's weight gradient is deferred to W (run the backward inside "
        "split_backward.weight_grads_deferred(stage, context.deferred[key]))")
    assert found["held after W"] == [], (
        f"activation never freed: after ZB-H1's W of microbatch 0 at stage 1, `saved` still "
        f"holds {found['held after W']}; W is the entry's last use: it must drop it from "
        f"`saved`, or under ZB-H1 a rank holds every microbatch it ran, above min(p, m)")
    assert found["deferred after W"] == [], (
        f"after ZB-H1's W of microbatch 0 at stage 1, context.deferred still holds "
        f"{found['deferred after W']}; W must pop its store (context.deferred.pop(key)) "
        f"when it flushes it")
    for index, (got, want) in enumerate(zip(found["after W"], expected["last"])):
        assert got is not None, f"after W the stage's parameter {index} has no gradient"
        assert_close(got, want, f"the stage's parameter {index} gradient after B and W",
                     likely_cause="B + W must be one whole backward", **TOLERANCE)


# ---------------------------------------------------------------- the executor on ranks

WRONG_DTYPE = "a boundary tensor of the wrong dtype"
SHARED_BUFFER = "two receives into one buffer"


def fingerprint(tensor) -> int | None:
    """A tensor's bytes as one number (equal bytes, equal numbers): what a message carried."""
    if tensor is None:
        return None
    return zlib.crc32(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())


def record_actions(executor):
    """Wrap the student's ``run_action`` as the executor calls it, to record what each action
    received and returned (as fingerprints: :func:`delivered_as_sent` compares them across the
    pipeline) and whether the action changed what it received (an action leaves its input as it
    came), and to check at once the last stage's forward contract: it leaves the microbatch's
    loss, a scalar, in ``context.losses`` (else the backward fails later, far from the cause).
    Returns (a function giving the record, read once the step is over, and undo)."""
    original, record, kept, changed_by = executor.run_action, {}, {}, []

    def run_action(action, stage, received, saved, context):
        key = (action.kind, action.microbatch, action.stage)
        if action.kind == "F" and received is not None:
            kept[key] = received  # the backward uses it
        as_received = fingerprint(received)
        returned = original(action, stage, received, saved, context)
        if fingerprint(received) != as_received:
            changed_by.append(key)
        if action.kind == "F" and action.stage == context.last_stage:
            loss = context.losses.get(action.microbatch)
            assert loss is not None and loss.dim() == 0, (
                f"run_action, F on the last stage (microbatch {action.microbatch}): it must leave "
                f"the microbatch's loss, a scalar, in context.losses; found "
                f"{'nothing' if loss is None else f'a tensor of shape {tuple(loss.shape)}'}")
        record[key] = (as_received, fingerprint(returned) if torch.is_tensor(returned) else None)
        return returned

    def rows():
        """The record as data: (kind, microbatch, stage, received, returned, whether what the
        forward received changed afterwards, whether it changed while the action ran)."""
        return [[*key, *value, key in kept and fingerprint(kept[key]) != value[0],
                 key in changed_by] for key, value in record.items()]

    executor.run_action = run_action
    return rows, lambda: setattr(executor, "run_action", original)


def overwritten(records: dict) -> str | None:
    """Where what a forward received changed after the forward used it (the backward then
    differentiates other values), or None."""
    for (kind, microbatch, stage), (_, _, changed, _) in sorted(records.items()):
        if changed:
            return (f"run_schedule's exchange: the activation stage {stage} received for "
                    f"microbatch {microbatch}'s forward changed after the forward used it, so "
                    "the backward differentiates other values (a later receive wrote into it?)")
    return None


def changed_in_place(records: dict) -> str | None:
    """Where an action changed the tensor it received while it ran, or None."""
    for (kind, microbatch, stage), (_, _, _, changed) in sorted(records.items()):
        if changed:
            return (f"run_action, {kind} of microbatch {microbatch} at stage {stage}: it changed "
                    "the tensor it received, in place; an action leaves its input as it came")
    return None


def delivered_as_sent(records: dict, last_stage: int) -> str | None:
    """Where an action received other bytes than its neighbouring stage's action returned
    (the forward's output to stage s + 1, the backward's input gradient to stage s - 1), or
    None: the unit blamed when the step differs is then the executor's delivery, not the
    actions."""
    for (kind, microbatch, stage), (received, _, _, _) in sorted(records.items()):
        source = (kind, microbatch, stage - 1) if kind == "F" else (kind, microbatch, stage + 1)
        if (kind == "F" and stage == 0) or (kind != "F" and stage == last_stage) or kind == "W":
            continue
        sent = records.get(source, (None, None))[1]
        if source in records and sent != received:
            direction = "forward" if kind == "F" else "backward"
            return (f"what stage {stage} received for the {direction} of microbatch {microbatch} "
                    f"is not what stage {source[2]} sent: run_schedule's exchange "
                    "(PipelineRun.exchange, post_exchange) delivered other bytes")
    return None


def record_point_to_point(members, dtype):
    """Patch torch.distributed's point-to-point calls to record what this rank posts together:
    one entry per posting call (a batch, or a lone isend/irecv/send/recv), each a list of
    ("send" or "recv", global peer, tag, bytes). A peer outside ``members`` (the pipeline's global
    ranks), or a tensor not of ``dtype`` (the boundary tensors' dtype), is refused at once,
    before it could hang or abort the backend. Returns (the record, undo)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    names = ("isend", "irecv", "send", "recv", "batch_isend_irecv")
    originals = {name: getattr(c10d, name) for name in names}
    calls, inside = [], []

    def entry(kind, peer, group_peer, group, tag, tensor):
        if peer is None and group_peer is not None:
            peer = group_peer if group is None else dist.get_global_rank(group, group_peer)
        if peer not in members:
            raise ValueError(
                f"rank {dist.get_rank()} posted a {kind} to global rank {peer}, which is not in "
                f"its pipeline (global ranks {members}): a peer is given as a rank in the "
                f"pipeline's group; translate it (dist.get_global_rank(group, peer))")
        if tensor.dtype != dtype:
            what = ("a receive into a buffer" if kind == "recv" else "a send") + \
                   f" of dtype {tensor.dtype}"
            raise TypeError(
                f"{WRONG_DTYPE}: rank {dist.get_rank()} posted {what} (tag {tag}, global peer "
                f"{peer}, shape {tuple(tensor.shape)}), but the stages exchange {dtype} tensors "
                f"(run_schedule's boundary_dtype={dtype}): "
                + ("make each receive buffer with dtype=boundary_dtype (torch.empty's default "
                   "is float32); gloo aborts where a buffer's size is not its message's"
                   if kind == "recv" else
                   "send the stage's output as it is, in boundary_dtype"))
        return (kind, int(peer), int(tag or 0), tensor.numel() * tensor.element_size())

    def lone(name):
        kind = "send" if "send" in name else "recv"

        @functools.wraps(originals[name])
        def wrapper(tensor, peer=None, group=None, tag=0, **kwargs):
            if not inside:
                group_peer = kwargs.get("group_dst", kwargs.get("group_src"))
                calls.append([entry(kind, peer, group_peer, group, tag, tensor)])
            return originals[name](tensor, peer, group, tag, **kwargs)
        return wrapper

    @functools.wraps(originals["batch_isend_irecv"])
    def batch(operations):
        calls.append([entry("send" if "send" in op.op.__name__ else "recv", op.peer, None,
                            None, op.tag, op.tensor) for op in operations])
        buffers = [op.tensor.untyped_storage().data_ptr() for op in operations
                   if "recv" in op.op.__name__]
        if len(set(buffers)) < len(buffers):
            raise ValueError(
                f"{SHARED_BUFFER}: rank {dist.get_rank()} posted {len(buffers)} receives in one "
                f"batch into {len(set(buffers))} buffer(s): each message needs a buffer of its "
                "own, or the later one overwrites the earlier")
        inside.append(True)
        try:
            return originals["batch_isend_irecv"](operations)
        finally:
            inside.pop()

    patched = {name: lone(name) for name in names[:4]}
    patched["batch_isend_irecv"] = batch
    for name, function in patched.items():
        setattr(c10d, name, function)
        setattr(dist, name, function)

    def undo():
        for name, function in originals.items():
            setattr(c10d, name, function)
            setattr(dist, name, function)
    return calls, undo


class CoalescedRequest:
    """A test double of NCCL's answer to ``batch_isend_irecv``: one request for the whole batch
    (gloo gives one per operation). Waiting for it waits for every operation of the batch."""

    def __init__(self, works, log, receives):
        self.works, self.log, self.number = works, log, len(log)
        log.append(("posted", self.number, receives))

    def wait(self, *args, **kwargs):
        self.log.append(("waited", self.number, None))
        return all(work.wait(*args, **kwargs) is not False for work in self.works)

    def is_completed(self):
        return all(work.is_completed() for work in self.works)


def coalesce_batches(executor):
    """In this rank, from now on: ``batch_isend_irecv`` answers with one :class:`CoalescedRequest`
    (as on NCCL), and every ``run_action`` of ``executor`` is logged; returns (the log, undo).
    The log, in order: ("posted", number, holds a receive) per batch, ("waited", number, None)
    per wait, ("compute", action, None) per action."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    log, batch, run_action = [], c10d.batch_isend_irecv, executor.run_action

    def one_request(operations):
        receives = any("recv" in operation.op.__name__ for operation in operations)
        return [CoalescedRequest(batch(operations), log, receives)]

    def logged(action, *args, **kwargs):
        log.append(("compute", str(action), None))
        return run_action(action, *args, **kwargs)

    c10d.batch_isend_irecv = dist.batch_isend_irecv = one_request
    executor.run_action = logged

    def undo():
        c10d.batch_isend_irecv = dist.batch_isend_irecv = batch
        executor.run_action = run_action
    return log, undo


def computed_before_waiting(log):
    """The first action computed while a posted batch that holds a receive was not yet waited
    for, or None."""
    receiving = set()  # batches posted with a receive, not waited for yet
    for what, number, receives in log:
        if what == "posted" and receives:
            receiving.add(number)
        elif what == "waited":
            receiving.discard(number)
        elif what == "compute" and receiving:
            return number  # the action
    return None


UNTRANSLATED = re.compile(r"(?:[Gg]lobal rank|to global rank) (\d+)")


def untranslated_peer(error, members):
    """The failure of a peer given to torch as a pipeline rank, in words: which rank it names
    and which global rank was meant."""
    found = UNTRANSLATED.search(str(error))
    peer = int(found.group(1)) if found else None
    meant = (f"; pipeline rank {peer} of this pipeline is global rank {members[peer]}"
             if peer is not None and peer < len(members) else "")
    return (f"a peer not translated to a global rank: torch was given peer {peer}, which is "
            f"not in this pipeline (global ranks {members}){meant}. post_exchange's peers are "
            f"ranks in the pipeline's group; translate each with dist.get_global_rank(group, "
            f"peer) (torch said: {error})")


def pipelined_and_single_device(impl, data, pipelines, coalesced=False, dtype=torch.float32):
    """One step of the student's executor on this rank's pipeline (``pipelines``: lists of
    global ranks), the single-device step, what this rank posted and (``coalesced``: every
    batch answered with one request, as on NCCL) which requests it waited for before computing.
    ``dtype``: the GPT's, so the stages' boundary tensors' (fp32: ``pipeline_train_step``;
    another: the kit's ``gpt_pipeline_step`` over ``run_schedule`` with that
    ``boundary_dtype``)."""
    import torch.distributed as dist

    world_rank = dist.get_rank()
    groups = [dist.new_group(members) for members in pipelines]  # every rank creates every group
    index = next(i for i, members in enumerate(pipelines) if world_rank in members)
    group = None if len(pipelines) == 1 else groups[index]
    m, device = data["microbatches"], current_device()
    torch.manual_seed(0)
    gpt = GPT(CONFIG).to(device, dtype)
    generator = torch.Generator().manual_seed(100 * index + m)  # each pipeline its own batch
    tokens, targets = (torch.randint(0, CONFIG.vocab_size, (MICRO_BATCH * m, CONFIG.seq_len),
                                     generator=generator).to(device) for _ in range(2))
    reference = copy.deepcopy(gpt)  # the single-device step, before the submission is loaded
    logits = reference(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    expected = {name: p.grad.cpu() for name, p in reference.named_parameters()}
    executor = impl.module("pipeline_executor")
    log, undo_coalescing = coalesce_batches(executor) if coalesced else ([], lambda: None)
    calls, undo_recording = record_point_to_point(pipelines[index], dtype)
    action_rows, undo_actions = record_actions(executor)
    try:
        if dtype == torch.float32:
            step = executor.pipeline_train_step(gpt, as_schedule(data), tokens, targets,
                                                group=group)
        else:
            run_schedule = functools.partial(executor.run_schedule, boundary_dtype=dtype)
            step = gpt_pipeline_step(run_schedule, gpt, as_schedule(data),
                                     list(tokens.split(MICRO_BATCH)),
                                     list(targets.split(MICRO_BATCH)), group=group)
    except ValueError as error:
        if group is None or not UNTRANSLATED.search(str(error)):
            raise
        raise ValueError(untranslated_peer(error, pipelines[index])) from None
    finally:
        undo_recording()
        undo_actions()
        undo_coalescing()
    return (index, float(step.loss), loss.item(), int(step.run.peak_saved),
            [(n, g.detach().cpu(), expected[n]) for n, g in step.grads.items()], calls,
            computed_before_waiting(log), action_rows())


def postings_as_exchanges(schedule, calls, members, rank, nbytes=None):
    """A pipeline rank's recorded postings as the plan's exchanges (steps: the kit's plan's);
    every message must carry ``nbytes`` (one microbatch's boundary tensor), if given."""
    by_tag = {transfer.message.tag: transfer.message
              for transfers in messages(schedule) for transfer in transfers}
    step_of = {message: exchange.step for exchange in exchange_plan(schedule)[rank]
               for message in exchange.sends + exchange.receives}
    exchanges, posted = [], []
    for call in calls:
        sends, receives = [], []
        for kind, peer, tag, size in call:
            message = by_tag.get(tag)
            mine = message is not None and (message.src if kind == "send" else message.dst) == rank
            other = None if message is None else (message.dst if kind == "send" else message.src)
            assert mine and members[other] == peer, (
                f"pipeline rank {rank} posted a {kind} with tag {tag} to global rank {peer}, "
                f"which is not a message of its schedule with that peer: post each message "
                f"with its own tag, to the rank in the pipeline's group that it goes to")
            assert nbytes is None or size == nbytes, (
                f"pipeline rank {rank} posted a {kind} of {size} bytes with tag {tag}; every "
                f"message carries one microbatch's boundary tensor, {nbytes} bytes (micro-batch "
                f"x sequence x hidden x the boundary dtype's bytes)")
            (sends if kind == "send" else receives).append(message)
            posted.append(message)
        exchanges.append(Exchange(min(step_of[m] for m in sends + receives),
                                  tuple(sends), tuple(receives)))
    wanted = sorted(step_of, key=lambda message: message.tag)
    assert sorted(posted, key=lambda message: message.tag) == wanted, (
        f"pipeline rank {rank} posted {len(posted)} sends and receives, its schedule needs "
        f"each of its {len(wanted)} messages posted once")
    return tuple(exchanges)


FP32, FP64 = torch.float32, torch.float64
CASES = {  # name: (schedule rows key, the layout of the pipelines, one request per batch, the
    # GPT's dtype: its boundary tensors')
    "gpipe, p=4, m=8": (("gpipe", 4, 8), "world", False, FP32),
    "1f1b, p=4, m=5": (("1f1b", 4, 5), "world", False, FP32),
    "1f1b, pipelines consecutive, p=2, m=4, one request per batch (NCCL)": (
        ("1f1b", 2, 4), "consecutive", True, FP32),
    "1f1b, pipelines strided, p=2, m=4, one request per batch (NCCL)": (
        ("1f1b", 2, 4), "strided", True, FP32),
    "1f1b, pipelines permuted, p=2, m=4": (("1f1b", 2, 4), "permuted", False, FP32),
    "1f1b, pipelines strided, p=2, m=4, fp64 boundary": (("1f1b", 2, 4), "strided", False, FP64),
    "naive, p=4, m=1": (("naive", 4, 1), "world", False, FP32),
    "zb-h1, pipelines permuted, p=2, m=4": (("zb-h1", 2, 4), "permuted", False, FP32),
    "interleaved, v=2, pipelines consecutive, p=2, m=4, one request per batch (NCCL)": (
        ("interleaved", 2, 4), "consecutive", True, FP32),
}
WORLD = 4
BOUNDARY_ELEMENTS = MICRO_BATCH * CONFIG.seq_len * CONFIG.hidden  # one microbatch's activation
TOLERANCES = {FP32: TOLERANCE, FP64: dict(atol=1e-10, rtol=1e-10),
              torch.bfloat16: dict(atol=2e-3, rtol=2e-2)}  # bf16: 8 bits of mantissa
COMPUTED_BEFORE_WAITING = (
    "the executor computed {action} before waiting for the request of the batch that brought its "
    "input. On NCCL batch_isend_irecv returns one request for the whole batch (modelled here on "
    "gloo): post_exchange must return it among the receive requests, which the executor waits "
    "for before it computes")


@pytest.mark.parametrize("case", sorted(CASES))
def test_pipelined_step_trains_like_one_device(impl, run_on_ranks, sweep_seed, case):
    (name, p, m), layout, coalesced, dtype = CASES[case]
    pipelines = group_layouts(WORLD, p, sweep_seed)[layout]
    check_pipelined_step(run_on_ranks, impl, f"{case} {pipelines} (seed {sweep_seed})", name,
                         ROWS[name, p, m], m, pipelines, coalesced, dtype)


def check_pipelined_step(run_on_ranks, impl, case, name, rows, m, pipelines, coalesced,
                         dtype=FP32):
    """One step of the student's executor on every pipeline of ``pipelines`` at once (each
    ``rows``, a schedule written as text), the GPT and its boundary tensors in ``dtype``: the
    postings, the loss, the gradients, the peak."""
    p = len(rows)
    data = as_data(rows, m, name)
    schedule = as_schedule(data)
    tolerance = TOLERANCES[dtype]
    loss_tolerance = TOLERANCES[max(FP32, dtype, key=lambda d: TOLERANCES[d]["atol"])]  # the
    # executor sums the microbatch losses in fp32 (PipelineRun.loss)
    nbytes = BOUNDARY_ELEMENTS * torch.finfo(dtype).bits // 8
    try:
        results = run_on_ranks(pipelined_and_single_device, WORLD, impl, data, pipelines,
                               coalesced, dtype)
    except RankFailure as failure:  # a posting of the wrong dtype, refused before it aborts
        if WRONG_DTYPE in str(failure):
            raise AssertionError(f"{case}: run_schedule's exchange: "
                                 f"{str(failure).splitlines()[0]}") from None
        if re.search(r'File "[^"]*pipeline_executor\.py", line \d+, in run_action\n', str(failure)):
            raise AssertionError(
                f"{case}: run_action raised inside the step ({str(failure).splitlines()[0]}): "
                "the unit comes first, test_run_action_returns_records_and_frees runs it alone "
                f"and names the action\n{failure}") from None
        raise
    for world_rank, result in enumerate(results):  # the most specific cause first
        index = result[0]
        where = f"{case}, pipeline rank {pipelines[index].index(world_rank)} (global {world_rank})"
        assert result[6] is None, f"{where}: " + COMPUTED_BEFORE_WAITING.format(action=result[6])
    reused = {}  # pipeline -> where a forward's input changed after use: the likely cause
    for index, members in enumerate(pipelines):  # the actions of a pipeline, all its ranks'
        records = {tuple(row[:3]): tuple(row[3:]) for world_rank in members
                   for row in results[world_rank][7]}
        misdelivered = changed_in_place(records) or delivered_as_sent(records, schedule.stages - 1)
        if misdelivered is not None:
            pytest.fail(f"{case}, pipeline {members}: {misdelivered}", pytrace=False)
        reused[index] = overwritten(records)
    for world_rank, (index, loss, expected_loss, peak, grads, calls, _, _) in enumerate(results):
        rank = pipelines[index].index(world_rank)
        where = f"{case}, pipeline rank {rank} (global {world_rank})"
        plan = postings_as_exchanges(schedule, calls, pipelines[index], rank, nbytes)
        if rank == 0:  # the whole pipeline's postings, jammed or not with rendezvous sends
            plans = {r: postings_as_exchanges(schedule, results[g][5], pipelines[index], r)
                     for r, g in enumerate(pipelines[index])}
            try:
                check_rendezvous(schedule, tuple(plans[r] for r in range(p)))
            except ScheduleError as error:
                pytest.fail(f"{where}: a send and a receive posted separately: on NCCL, where a "
                            f"send waits for its receive, this pipeline hangs ({error}); post "
                            f"each exchange's sends and receives together, as one batch",
                            pytrace=False)
        assert plan or p == 1, f"{where}: posted nothing"
        if m > 1 and abs(loss - m * expected_loss) < 1e-4 * m:
            pytest.fail(f"{where}: the loss is not scaled by 1/m: {loss:.5f} is m = {m} times "
                        f"the single-device mean {expected_loss:.5f}", pytrace=False)
        assert_close(loss, expected_loss, f"{case} loss", rank=world_rank,
                     likely_cause=reused[index] or "the forward action: is the last stage's loss "
                     "divided by the number of microbatches, and the right input fed to stage 0?",
                     **loss_tolerance)
        assert grads, f"{where}: holds no gradient: did the backward action run?"
        for parameter, gradient, expected in grads:
            assert_close(gradient, expected, f"{case} gradient of {parameter}", rank=world_rank,
                         likely_cause=reused[index] or "the backward action: backward from the "
                         "saved output with the received gradient, returning the input's "
                         "gradient; the loss scaled by 1/m", **tolerance)
        promised, rule = promised_peak(name, schedule, rank)
        last_use = "W (ZB-H1's weight-gradient pass)" if schedule.split_backward else "backward"
        assert peak <= promised, (
            f"{where}: activation never freed: the rank held {peak} (microbatch, stage) entries "
            f"in `saved` at once, above {name}'s {promised} ({rule}); the {last_use} must drop "
            f"its microbatch's entry from `saved`")
        assert peak == promised, (f"{where}: held at most {peak} microbatches' activations, "
                                  f"the schedule holds {promised}: does the forward keep its entry?")
