"""Lab 5, graded: data parallelism from backward hooks (``ddp_hooks.py``).

4 CPU ranks in Megatron's layout with tp = 2, dp = 2: two data-parallel groups at once (the
RDP groups, one per TP rank), neither of them the whole world. Each group trains its *own*
batch (seeded by the TP rank), so an all-reduce over the world mixes the two and is caught.
Every rank wraps the same small MLP in the student's ``OverlappingDataParallel`` over its RDP
group, with one bucket per parameter and with buckets of a few parameters, and runs

1. one step: backward, ``finish_gradient_sync``, SGD: every gradient and weight against one
   device on the group's whole batch;
2. two micro-batches, the first under ``no_sync``: the accumulated, averaged gradient;
3. the same two micro-batches, the first under a ``no_sync`` nested in another (the backward
   runs in the outer one, after the inner one ended), then an exception raised inside a
   ``no_sync`` and caught, then the second micro-batch: ``no_sync`` must put back the state it
   found however its block ends, so nothing may travel in the outer ``no_sync`` and the last
   backward must launch every bucket.

Before the student's module is loaded, the rank wraps ``dist.all_reduce`` to log every call
(the phase of the test it ran in, its group's ranks, its size, whether it was async, which
gradients were ready, and whether its handle was waited before the step), and registers its own
gradient hooks (they run before the student's) to know which gradients are ready. From that
log the test checks the quantities the lab teaches, with nothing asserted on time: one
all-reduce per bucket, every one launched from the hooks *during* the backward (none left
exposed after it), the first while gradients were still being computed (overlap), each bucket
only once all its gradients were ready, and none during ``no_sync``. After every backward the
rank also notes each bucket's ``ready`` count: where a bucket travels too early or too late,
the message says which bucket, and what its count was against the number of its gradients.

Buckets follow the contract in the module's docstring: parameters in reverse order, filled
greedily up to ``bucket_bytes`` (a parameter larger than a bucket alone). Tolerance (fp32):
1e-6 absolute and relative (only the order of the sums changes).
"""
import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.checks import assert_close
from reference_impl.comm.groups import build_rank_layout
from reference_impl.comm.device import current_device
from reference_impl.comm.process_groups import create_process_groups

pytestmark = pytest.mark.lab5

WORLD, TP, SAMPLES, LR = 4, 2, 4, 0.1
TOLERANCE = dict(atol=1e-6, rtol=1e-6)
TIMEOUT = 120


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 4))


def batch(group: int, micro: int, member: int):
    """Data-parallel group ``group``'s samples of micro-batch ``micro`` held by ``member``."""
    generator = torch.Generator().manual_seed(1000 * group + 10 * micro + member)
    return torch.randn(SAMPLES, 8, generator=generator), torch.randn(SAMPLES, 4,
                                                                       generator=generator)


def expected_buckets(bucket_bytes: int) -> list[list[str]]:
    """The contract: parameter names in reverse order, greedily up to ``bucket_bytes``."""
    buckets, size = [], 0
    for name, p in reversed(list(mlp().named_parameters())):
        nbytes = p.numel() * p.element_size()
        if buckets and bucket_bytes and size + nbytes <= bucket_bytes:
            buckets[-1].append(name)
            size += nbytes
        else:
            buckets.append([name])
            size = nbytes
    return buckets


def single_device(group: int, members: int, micro_batches: int):
    """One device on the group's whole batch: the mean loss's gradients (micro-batches each
    scaled by 1 / micro_batches) and the weights after one SGD step."""
    model = mlp()
    for micro in range(micro_batches):
        xs, ys = zip(*(batch(group, micro, member) for member in range(members)))
        (F.mse_loss(model(torch.cat(xs)), torch.cat(ys)) / micro_batches).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return grads, {name: p.detach().clone() for name, p in model.named_parameters()}


# ----------------------------------------------------------------- on every rank

class _LoggedHandle:
    def __init__(self, handle, entry):
        self.handle, self.entry = handle, entry

    def wait(self, *args, **kwargs):
        self.entry["waited"] = True
        return self.handle.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.handle, name)


def log_all_reduces(log: list, phase: list, ready: list):
    """From now on every dist.all_reduce in this process appends an entry to ``log``."""
    original = dist.all_reduce

    def logged(tensor, *args, **kwargs):
        group = kwargs.get("group", args[1] if len(args) > 1 else None)
        entry = {"phase": phase[0], "ranks": dist.get_process_group_ranks(group or
                                                                          dist.group.WORLD),
                 "numel": tensor.numel(), "async": bool(kwargs.get("async_op", False)),
                 "ready": list(ready), "waited": False}
        log.append(entry)
        handle = original(tensor, *args, **kwargs)
        return _LoggedHandle(handle, entry) if handle is not None else None

    dist.all_reduce = logged


def backward(loss, ready):
    """The backward, with a named error where the student's hook reads a missing gradient."""
    ready.clear()
    try:
        loss.backward()
    except (AttributeError, TypeError) as error:
        raise RuntimeError(
            f"the backward failed inside the gradient hooks ({error}) with {len(ready)} "
            "gradients ready. Likely cause: a bucket flushed before all its gradients are "
            "ready (a .grad still None is read)") from error


class RaisedInsideNoSync(Exception):
    """Raised by the test inside a ``no_sync`` block, and caught."""


def bucket_counts(ddp) -> list[int]:
    return [int(bucket.ready) for bucket in ddp.buckets]


def nested_and_raised(ddp, model, group, member, phase, ready, counts):
    """Run 3 of the module docstring; returns the gradients after finish_gradient_sync."""
    device = current_device()
    model.zero_grad()
    model.load_state_dict(mlp().state_dict())
    counts.append(bucket_counts(ddp))
    for micro in range(2):
        x, y = (t.to(device) for t in batch(group, micro, member))
        if micro == 0:
            with ddp.no_sync():
                with ddp.no_sync():
                    pass
                phase[0] = NESTED
                backward(F.mse_loss(ddp(x), y) / 2, ready)
            phase[0] = RAISED
            try:
                with ddp.no_sync():
                    raise RaisedInsideNoSync
            except RaisedInsideNoSync:
                pass
        else:
            phase[0] = AFTER_RAISED
            backward(F.mse_loss(ddp(x), y) / 2, ready)
        counts.append(bucket_counts(ddp))
    phase[0] = f"{NESTED_AND_RAISED}: finish"
    ddp.finish_gradient_sync()
    return {n: p.grad.cpu().clone() for n, p in model.named_parameters()}


NESTED_AND_RAISED = "nested and raised"
NESTED = f"{NESTED_AND_RAISED}: in the outer no_sync, after the inner one ended"
RAISED = f"{NESTED_AND_RAISED}: raised inside no_sync"
AFTER_RAISED = f"{NESTED_AND_RAISED}: backward after the exception"
RUNS = ("one step", "accumulated", NESTED_AND_RAISED)


def ddp_on_rank(impl, bucket_bytes: int):
    device = current_device()
    groups = create_process_groups(build_rank_layout(WORLD, tp=TP, pp=1, order="megatron"))
    group, member = groups.coordinates.tp_rank, groups.coordinates.rdp_rank
    model = mlp().to(device)
    log, phase, ready = [], ["outside"], []
    for name, p in model.named_parameters():  # registered first: they run before the student's
        p.register_post_accumulate_grad_hook(lambda p, name=name: ready.append(name))
    log_all_reduces(log, phase, ready)
    ddp = impl.module("ddp_hooks").OverlappingDataParallel(model, group=groups.rdp,
                                                           bucket_bytes=bucket_bytes)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    result = {"dp_ranks": dist.get_process_group_ranks(groups.rdp), "group": group,
              "members": dist.get_world_size(groups.rdp),
              "bucket_sizes": [len(bucket.params) for bucket in ddp.buckets]}
    for run, micro_batches in (("one step", 1), ("accumulated", 2)):
        model.zero_grad()
        model.load_state_dict(mlp().state_dict())  # both runs start from the same weights
        counts = [bucket_counts(ddp)]  # before the run, then after each backward
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            x, y = (t.to(device) for t in batch(group, micro, member))
            with contextlib.nullcontext() if last else ddp.no_sync():
                phase[0] = f"{run}: " + ("backward" if last else "no_sync")
                backward(F.mse_loss(ddp(x), y) / micro_batches, ready)
            counts.append(bucket_counts(ddp))
        phase[0] = f"{run}: finish"
        ddp.finish_gradient_sync()
        phase[0] = "outside"
        result[run] = {"grads": {n: p.grad.cpu().clone() for n, p in model.named_parameters()},
                       "waited": [entry["waited"] for entry in log], "counts": counts}
        if run == "one step":
            optimizer.step()
            result[run]["weights"] = {n: p.detach().cpu().clone()
                                      for n, p in model.named_parameters()}
    counts = []
    result[NESTED_AND_RAISED] = {"grads": nested_and_raised(ddp, model, group, member, phase,
                                                            ready, counts), "counts": counts,
                                 "waited": [entry["waited"] for entry in log]}
    phase[0] = "outside"
    result["log"] = log
    return result


# ----------------------------------------------------------------- in the test

def check_log(rank, result, bucket_bytes):
    """The all-reduces the student's hooks launched: which group, when, how many, waited."""
    buckets = expected_buckets(bucket_bytes)
    log, dp_ranks = result["log"], result["dp_ranks"]
    every = [name for bucket in buckets for name in bucket]
    for index, entry in enumerate(log):
        assert entry["ranks"] == dp_ranks, (
            f"rank {rank}: all-reduce #{index} ran over ranks {entry['ranks']}, not the "
            f"data-parallel group {dp_ranks}: the wrong group (use the group the wrapper was "
            "given; with tp = 2 the world mixes two data-parallel groups' batches)")
        assert not entry["phase"].endswith("no_sync"), (
            f"rank {rank}: an all-reduce ran during no_sync ({entry['phase']}): all-reducing "
            "during no_sync; inside it the hooks must launch nothing, .grad just accumulates")
    for run in RUNS:
        if run == NESTED_AND_RAISED:
            check_no_sync_state(rank, log)
        launched = [entry for entry in log if entry["phase"].startswith(run)]
        after = [entry for entry in launched if entry["phase"].endswith("finish")]
        assert not after, (
            f"rank {rank}, {run}: {len(after)} of {len(launched)} all-reduces were launched "
            "after the backward ended (exposed communication, each bucket should leave from "
            f"the hook as its last gradient arrives). {count_evidence(result, run)}")
        assert len(launched) == len(buckets), (
            f"rank {rank}, {run}: {len(launched)} all-reduces in the backward, expected one "
            f"per bucket: {len(buckets)} buckets of at most {bucket_bytes} bytes "
            f"({buckets})")
        assert all(entry["async"] for entry in launched), (
            f"rank {rank}, {run}: a blocking all-reduce in a hook stalls the backward until "
            "it is done: launch it with async_op=True and keep the handle")
        pending = [list(bucket) for bucket in buckets]
        for index, entry in enumerate(launched):
            sized = [b for b in pending if numel(b) == entry["numel"]]
            match = [b for b in sized if set(b) <= set(entry["ready"])]
            early = ([f"bucket {sized[0]} left with {len(set(sized[0]) & set(entry['ready']))} "
                      f"of its {len(sized[0])} gradients ready"] if sized else [])
            assert match, (
                f"rank {rank}, {run}: all-reduce #{index} ({entry['numel']} elements) was "
                f"launched with only {entry['ready']} ready; the buckets are {pending}. "
                + "".join(f"Evidence: {line}. " for line in early)
                + "Likely cause: a bucket flushed before all its gradients are ready (its count "
                "must reach the number of its gradients first)")
            pending.remove(match[0])
        if len(buckets) > 1:
            assert len(launched[0]["ready"]) < len(every), (
                f"rank {rank}, {run}: the first all-reduce started only once every gradient "
                "was ready: nothing overlaps the backward")
        waited = result[run]["waited"]
        first = log.index(launched[0])
        missing = [i for i in range(first, first + len(launched)) if not waited[i]]
        assert not missing, (
            f"rank {rank}, {run}: the handles of all-reduces {missing} were not waited before "
            "the step: waiting on handles missing before the step (until wait() the tensor may "
            "hold the local gradient or half a sum)")


def numel(names) -> int:
    return sum(mlp().get_parameter(name).numel() for name in names)


def check_no_sync_state(rank, log):
    """Run 3: nothing in the outer no_sync; everything in the backward after the exception."""
    nested = [entry for entry in log if entry["phase"] == NESTED]
    assert not nested, (
        f"rank {rank}: {len(nested)} all-reduce(s) ran inside an outer no_sync, after an inner "
        "no_sync had ended: the nested no_sync switched synchronisation on when it ended; "
        "leaving a no_sync must put back the state it found (off, inside another no_sync)")
    synced = [entry for entry in log if entry["phase"] == AFTER_RAISED]
    late = [entry for entry in log if entry["phase"] == f"{NESTED_AND_RAISED}: finish"]
    assert synced or not late, (
        f"rank {rank}: after an exception raised inside no_sync (and caught), the next backward "
        f"launched nothing ({len(late)} all-reduces left only at finish_gradient_sync): "
        "synchronisation stayed off after the exception; no_sync must put back the state it "
        "found also when its block raises")


def count_evidence(result, run) -> str:
    """What the buckets' ready counts (noted before the run and after each of its backwards)
    say about a bucket that did not leave during the backward."""
    sizes, counts = result["bucket_sizes"], result[run]["counts"]
    start, unsynced, synced = counts[0], counts[1:-1], counts[-1]
    for bucket, size in enumerate(sizes):
        where = f"Evidence: bucket #{bucket} ({size} gradients)"
        if start[bucket]:
            return (f"{where} started the run's first backward at a count of {start[bucket]}. "
                    "Likely cause: the count was not reset after the previous step, so it "
                    f"passes {size} without ever equalling it (finish_gradient_sync leaves "
                    "every bucket as before any backward)")
        if any(counted[bucket] != start[bucket] for counted in unsynced):
            return (f"{where} counted {unsynced[-1][bucket]} during no_sync. Likely cause: "
                    f"counted during no_sync, so the synced backward starts there and passes "
                    f"{size} without equalling it (under no_sync nothing is counted)")
        if synced[bucket] != size:
            return (f"{where} counted {synced[bucket]} in a backward that gave it {size} "
                    "gradients. Likely cause: the count does not go up by exactly one per "
                    "arriving gradient")
    return (f"Evidence: every bucket counted all its gradients ({sizes}). Likely cause: the "
            "bucket is not launched at the arrival that completes its count")


def grad_cause(actual, expected, members):
    if torch.allclose(actual, expected * members, **TOLERANCE):
        return (f"it is {members} times the mean: averaging forgotten (the all-reduce sums; "
                f"divide by the data-parallel group's size, {members})")
    if torch.allclose(actual, expected * members / WORLD, **TOLERANCE):
        return (f"divided by the world size {WORLD}, not the data-parallel group's size "
                f"{members}")
    return ("is the sum waited for and copied back into each .grad, in the bucket's order, "
            "with each gradient's own slice?")


@pytest.mark.parametrize("bucket_bytes", [0, 600], ids=["one bucket per parameter",
                                                        "buckets of a few parameters"])
def test_ddp_from_hooks_matches_one_device_and_overlaps(impl, run_on_ranks, bucket_bytes):
    results = run_on_ranks(ddp_on_rank, WORLD, impl, bucket_bytes, timeout=TIMEOUT)
    for rank, result in enumerate(results):
        members = result["members"]
        check_log(rank, result, bucket_bytes)
        for run, micro_batches in zip(RUNS, (1, 2, 2)):
            grads, weights = single_device(result["group"], members, micro_batches)
            where = (f"{run}, dp group {result['dp_ranks']}, bucket_bytes {bucket_bytes}")
            for name, value in grads.items():
                actual = result[run]["grads"][name]
                assert_close(actual, value, f"{where}: {name} grad", rank=rank,
                             against="one device on the group's whole batch",
                             likely_cause=grad_cause(actual, value, members), **TOLERANCE)
            for name, value in weights.items() if run == "one step" else ():
                assert_close(result[run]["weights"][name], value, f"{where}: {name} after SGD",
                             rank=rank, **TOLERANCE)
