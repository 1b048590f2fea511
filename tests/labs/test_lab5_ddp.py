"""Lab 5, graded: data parallelism from backward hooks (``ddp_hooks.py``).

**The sweep** (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws other cases, every
failure prints its seed and case): 4 CPU ranks cut into data-parallel groups of 2
(consecutive {0, 1} {2, 3}, strided {0, 2} {1, 3}, permuted) and of 4 (the world), every group
of a layout at once, each training a batch of its own, so an all-reduce over the world, or a
mean over the world's size, gives other numbers. Each case draws a bucket size (0: one bucket
per parameter; byte counts that no parameter's size divides) and a dtype (fp32, bf16: the
buckets are counted in bytes, so bf16 packs twice the elements). The MLP's parameters have
odd sizes (7 x 13, 13, 13 x 11, ...). On every rank of a case, the student's
``OverlappingDataParallel`` wraps a fresh copy of it over the rank's group, and runs

1. three SGD steps (``step 0`` to ``step 2``): backward, ``finish_gradient_sync``, read
   ``.grad``, step, read the weights; the hooks stay registered and the buckets' counts must be
   back where they started after each step;
2. ``accumulated``: two micro-batches, the first under ``no_sync``;
3. ``nested and raised``: the same micro-batches, the first under a ``no_sync`` nested in
   another (the backward runs in the outer one, after the inner one ended), then an exception
   raised inside a ``no_sync`` and caught, then the second micro-batch: ``no_sync`` must put
   back the state it found however its block ends, so nothing may travel in the outer
   ``no_sync`` and the last backward must launch every bucket;
4. ``all under no_sync``: both micro-batches under ``no_sync``, so ``finish_gradient_sync``
   sends every bucket. After every ``finish_gradient_sync`` each bucket must be as before any
   backward: no handle, no tensor, nothing counted.

Before the student's module is loaded, each rank starts recording every collective (its kind,
its group's ranks, its bytes, its reduce op, whether it was async, which gradients were ready,
whether its handle was waited before the step), and registers its own gradient hooks (they run
before the student's) to know which gradients are ready. From that log, in this order:

* **the group**: every collective over the wrapper's data-parallel group;
* **the communication contract** (``comm_contract.check_contract``) of every phase: in a synced
  backward one ``all_reduce`` per bucket over the group, of the bucket's bytes (its gradients'
  elements times their size); nothing under ``no_sync`` and nothing in
  ``finish_gradient_sync``; an extra, missing, mis-grouped or mis-sized collective is named;
* **the timing of each launch**: async, only once all its bucket's gradients were ready, the
  first while gradients were still being computed (overlap), every handle waited before the
  step. After every backward the rank also notes each bucket's ``ready`` count: where a bucket
  travels too early or too late, the message says which bucket and what its count was;
* **the values**: every ``.grad`` after each ``finish_gradient_sync`` (dtype and value) and
  every weight after each SGD step, against one device on the group's whole batch.

Where a gradient is wrong, the test tries the usual mistakes (not averaged, averaged twice,
divided by the world's size, this rank's own gradient left in ``.grad``) on every case of the
sweep and names the one that explains them all: with groups of 2 in a world of 4, "divided by
the world's size" and "averaged twice" give the same numbers; the world case tells them apart.

Buckets follow the contract in the module's docstring: parameters in reverse order, filled
greedily up to ``bucket_bytes`` (a parameter larger than a bucket alone). Tolerances: fp32
1e-6 absolute and relative (only the order of the sums changes); bf16 1e-2 (the ranks compute
in bf16, one device in fp32 from the same bf16 weights and inputs).
"""
import contextlib
import functools
import inspect

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.checks import assert_close
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.course.sweeps import draw, group_layouts, group_of, label

pytestmark = pytest.mark.lab5

WORLD, SAMPLES, LR, STEPS = 4, 3, 0.1, 3
DP_SIZES = (2, 4)
BUCKET_BYTES = (0, 250, 600)  # 0: one bucket per parameter; no parameter's bytes divide these
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCES = {"fp32": dict(atol=1e-6, rtol=1e-6), "bf16": dict(atol=1e-2, rtol=1e-2)}
TIMEOUT = 120


def mlp(dtype: str = "fp32") -> nn.Module:
    """The wrapped model: parameters of odd sizes (7 x 13, 13, 13 x 11, 11, 11 x 5, 5)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 11), nn.Tanh(),
                         nn.Linear(11, 5)).to(DTYPES[dtype])


def batch(seed: int, group: int, step: int, micro: int, member: int):
    """Data-parallel group ``group``'s samples of (step, micro-batch) held by ``member``."""
    generator = torch.Generator().manual_seed(
        100_000 * seed + 1000 * group + 100 * step + 10 * micro + member)
    return (torch.randn(SAMPLES, 7, generator=generator),
            torch.randn(SAMPLES, 5, generator=generator))


def layouts(seed: int, world: int = WORLD, sizes=DP_SIZES) -> dict:
    """{(dp, layout name): the groups}, for every group size of the sweep."""
    return {(dp, name): groups for dp in sizes
            for name, groups in group_layouts(world, dp, seed).items()}


def sweep_cases(seed: int, world: int = WORLD, sizes=DP_SIZES, bucket_bytes=BUCKET_BYTES,
                dtypes=tuple(DTYPES), extra: int = 0) -> list[dict]:
    """The drawn cases: every layout, bucket size and dtype at least once."""
    space = {"layout": list(layouts(seed, world, sizes)), "bucket_bytes": list(bucket_bytes),
             "dtype": list(dtypes)}
    return [{"dp": case["layout"][0], "layout": case["layout"][1],
             "bucket_bytes": case["bucket_bytes"], "dtype": case["dtype"]}
            for case in draw(space, seed, extra)]


def expected_buckets(bucket_bytes: int, dtype: str) -> list[list[str]]:
    """The contract: parameter names in reverse order, greedily up to ``bucket_bytes``."""
    buckets, size = [], 0
    for name, p in reversed(list(mlp(dtype).named_parameters())):
        nbytes = p.numel() * p.element_size()
        if buckets and bucket_bytes and size + nbytes <= bucket_bytes:
            buckets[-1].append(name)
            size += nbytes
        else:
            buckets.append([name])
            size = nbytes
    return buckets


# ----------------------------------------------------------------- one device, in the test

@functools.lru_cache(maxsize=None)
def single_device(seed: int, dtype: str, group: int, members: int) -> dict:
    """One device (fp32, from the ranks' initial weights and inputs) on the group's whole
    batch: per step the mean loss's gradients and the weights after SGD; the two
    micro-batches' accumulated gradient (each scaled by 1/2); each member's own gradient at
    step 0 (what a rank holds before any communication)."""
    rounded = DTYPES[dtype]

    def inputs(step, micro, member):
        return tuple(t.to(rounded).float() for t in batch(seed, group, step, micro, member))

    def gradients(model, step, micros, sources):
        model.zero_grad()
        for micro in range(micros):
            xs, ys = zip(*(inputs(step, micro, m) for m in sources))
            (F.mse_loss(model(torch.cat(xs)), torch.cat(ys)) / micros).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    model = mlp(dtype).float()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    found = {"own": [gradients(mlp(dtype).float(), 0, 1, [m]) for m in range(members)]}
    for step in range(STEPS):
        grads = gradients(model, step, 1, range(members))
        optimizer.step()
        found[f"step {step}"] = {"grads": grads, "weights": {
            name: p.detach().clone() for name, p in model.named_parameters()}}
    found["accumulated"] = {"grads": gradients(mlp(dtype).float(), 0, 2, range(members))}
    found[NESTED_AND_RAISED] = found[DEFERRED] = found["accumulated"]
    return found


# ----------------------------------------------------------------- on every rank

class _LoggedHandle:
    def __init__(self, handle, entry):
        self.handle, self.entry = handle, entry

    def wait(self, *args, **kwargs):
        self.entry["waited"] = True
        return self.handle.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.handle, name)


def payload(tensors) -> tuple[int, int]:
    """(elements, bytes) of a collective's payload, a tensor or a list of them."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel(), tensors.numel() * tensors.element_size()
    sizes = [payload(t) for t in tensors]
    return sum(n for n, _ in sizes), sum(b for _, b in sizes)


class HookLog(CommTracer):
    """Every collective of this rank: its kind, group, bytes, reduce op, whether it was async
    and its handle waited, the phase of the run (``phase[0]``) and the gradients ready then."""

    def __init__(self, phase: list, ready: list):
        super().__init__()
        self.phase, self.ready, self.entries = phase, ready, []

    def _wrap(self, op, argument, original):
        signature = inspect.signature(original)
        name = list(signature.parameters)[argument]

        def logged(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs).arguments
            group = bound.get("group") or dist.group.WORLD
            numel, nbytes = payload(bound[name])
            entry = {"op": op, "phase": self.phase[0], "numel": numel, "nbytes": nbytes,
                     "ranks": dist.get_process_group_ranks(group),
                     "reduce": str(bound.get("op", dist.ReduceOp.SUM)).split(".")[-1],
                     "async": bool(bound.get("async_op", False)), "ready": list(self.ready),
                     "waited": False}
            self.entries.append(entry)
            handle = original(*args, **kwargs)
            return _LoggedHandle(handle, entry) if handle is not None else None

        return logged


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


NESTED_AND_RAISED = "nested and raised"
NESTED = f"{NESTED_AND_RAISED}: in the outer no_sync, after the inner one ended"
RAISED = f"{NESTED_AND_RAISED}: raised inside no_sync"
AFTER_RAISED = f"{NESTED_AND_RAISED}: backward after the exception"
DEFERRED = "all under no_sync"  # finish_gradient_sync sends what no backward sent
RUNS = tuple(f"step {s}" for s in range(STEPS)) + ("accumulated", NESTED_AND_RAISED, DEFERRED)


def bucket_counts(ddp) -> list[int]:
    return [int(bucket.ready) for bucket in ddp.buckets]


def bucket_states(ddp) -> list[dict]:
    """What each bucket holds: its count, and whether it keeps a handle or a tensor."""
    return [{"ready": int(bucket.ready), "handle": bucket.handle is not None,
             "flat": bucket.flat is not None} for bucket in ddp.buckets]


def grads_now(model) -> dict:
    return {n: p.grad.detach().cpu().clone() if p.grad is not None else None
            for n, p in model.named_parameters()}


class Run:
    """One case on this rank: the wrapper, its log, and what it finds."""

    def __init__(self, impl, case, seed, handle, result, log, phase, ready):
        self.case, self.seed, self.log, self.phase, self.ready = case, seed, log, phase, ready
        self.group, self.member, self.result = result["group"], result["member"], result
        self.start = len(log.entries)
        self.device = current_device()
        self.model = mlp(case["dtype"]).to(self.device)
        for name, p in self.model.named_parameters():  # first: they run before the student's
            p.register_post_accumulate_grad_hook(lambda p, name=name: ready.append(name))
        self.ddp = impl.module("ddp_hooks").OverlappingDataParallel(
            self.model, group=handle, bucket_bytes=case["bucket_bytes"])
        result["bucket_sizes"] = [len(bucket.params) for bucket in self.ddp.buckets]

    def data(self, step, micro):
        dtype = DTYPES[self.case["dtype"]]
        return (t.to(self.device, dtype) for t in
                batch(self.seed, self.group, step, micro, self.member))

    def reset(self):
        self.model.zero_grad()
        self.model.load_state_dict(mlp(self.case["dtype"]).state_dict())

    def finish(self, run, counts):
        self.phase[0] = f"{run}: finish"
        self.ddp.finish_gradient_sync()
        self.result[run] = {"grads": grads_now(self.model), "counts": counts,
                            "waited": [e["waited"] for e in self.log.entries[self.start:]],
                            "buckets": bucket_states(self.ddp)}

    def steps(self):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.reset()
        for step in range(STEPS):
            run = f"step {step}"
            self.model.zero_grad()
            counts = [bucket_counts(self.ddp)]
            x, y = self.data(step, 0)
            self.phase[0] = f"{run}: backward"
            backward(F.mse_loss(self.ddp(x), y), self.ready)
            counts.append(bucket_counts(self.ddp))
            self.finish(run, counts)
            optimizer.step()
            self.result[run]["weights"] = {n: p.detach().cpu().clone()
                                           for n, p in self.model.named_parameters()}

    def accumulated(self):
        self.reset()
        counts = [bucket_counts(self.ddp)]
        for micro in range(2):
            x, y = self.data(0, micro)
            with contextlib.nullcontext() if micro else self.ddp.no_sync():
                self.phase[0] = "accumulated: " + ("backward" if micro else "no_sync")
                backward(F.mse_loss(self.ddp(x), y) / 2, self.ready)
            counts.append(bucket_counts(self.ddp))
        self.finish("accumulated", counts)

    def nested_and_raised(self):
        self.reset()
        counts = [bucket_counts(self.ddp)]
        for micro in range(2):
            x, y = self.data(0, micro)
            if micro == 0:
                with self.ddp.no_sync():
                    with self.ddp.no_sync():
                        pass
                    self.phase[0] = NESTED
                    backward(F.mse_loss(self.ddp(x), y) / 2, self.ready)
                self.phase[0] = RAISED
                try:
                    with self.ddp.no_sync():
                        raise RaisedInsideNoSync
                except RaisedInsideNoSync:
                    pass
            else:
                self.phase[0] = AFTER_RAISED
                backward(F.mse_loss(self.ddp(x), y) / 2, self.ready)
            counts.append(bucket_counts(self.ddp))
        self.finish(NESTED_AND_RAISED, counts)

    def deferred(self):
        """Every micro-batch under no_sync: finish_gradient_sync sends every bucket."""
        self.reset()
        counts = [bucket_counts(self.ddp)]
        for micro in range(2):
            x, y = self.data(0, micro)
            with self.ddp.no_sync():
                self.phase[0] = f"{DEFERRED}: no_sync"
                backward(F.mse_loss(self.ddp(x), y) / 2, self.ready)
            counts.append(bucket_counts(self.ddp))
        self.finish(DEFERRED, counts)


def ddp_on_rank(impl, seed: int, cases: list[dict], world: int = WORLD, sizes=DP_SIZES):
    """Every case of the sweep, one after the other, on this rank: {case label: result}."""
    rank = dist.get_rank()
    handles = {}
    for key, groups in layouts(seed, world, sizes).items():  # every rank, every group, in order
        made = [dist.new_group(ranks) for ranks in groups]
        handles[key] = made[groups.index(group_of(rank, groups))]
    phase, ready, found = ["construction"], [], {}
    with HookLog(phase, ready) as log:  # recording before the submission runs in this process
        for case in cases:
            groups = layouts(seed, world, sizes)[case["dp"], case["layout"]]
            members = group_of(rank, groups)
            start = len(log.entries)
            result = {"dp_ranks": members, "group": groups.index(members),
                      "member": members.index(rank), "error": None}
            try:
                run = Run(impl, case, seed, handles[case["dp"], case["layout"]], result, log,
                          phase, ready)
                run.steps()
                run.accumulated()
                run.nested_and_raised()
                run.deferred()
            except Exception as error:  # named in the test, after what the log shows
                result["error"] = f"{type(error).__name__}: {error}"
                result["error_phase"] = phase[0]
            phase[0] = "outside"
            result["log"] = log.entries[start:]
            for index, entry in enumerate(result["log"]):
                entry["index"] = index
            found[label(case, seed)] = result
    return found


# ----------------------------------------------------------------- in the test: the log

def numel(names) -> int:
    return sum(mlp().get_parameter(name).numel() for name in names)


def phases_of(run: str) -> list[str]:
    if run.startswith("step"):
        return [f"{run}: backward", f"{run}: finish"]
    if run == "accumulated":
        return ["accumulated: no_sync", "accumulated: backward", "accumulated: finish"]
    if run == DEFERRED:
        return [f"{DEFERRED}: no_sync", f"{DEFERRED}: finish"]
    return [NESTED, RAISED, AFTER_RAISED, f"{NESTED_AND_RAISED}: finish"]


SYNCED = ({f"step {s}: backward" for s in range(STEPS)}
          | {"accumulated: backward", AFTER_RAISED, f"{DEFERRED}: finish"})
FORMULA = ("in a synced backward one all_reduce per bucket over the data-parallel group, of the "
           "bucket's bytes; nothing under no_sync; nothing in finish_gradient_sync, unless no "
           "backward was synced: then it sends every bucket")


def check_contracts(rank, result, case, where):
    """Each phase's collectives against the formula (kind, group, count, bytes), up to the
    phase that raised, if one did."""
    buckets = expected_buckets(case["bucket_bytes"], case["dtype"])
    size = mlp(case["dtype"])[0].weight.element_size()
    phases = [phase for run in RUNS for phase in phases_of(run)]
    if result["error"] is not None:
        phases = phases[:phases.index(result["error_phase"])] \
            if result.get("error_phase") in phases else []
    for phase in phases:
        calls = [{"op": e["op"], "ranks": e["ranks"], "nbytes": e["nbytes"], "peer": None}
                 for e in result["log"] if e["phase"] == phase]
        wanted = ([expected("all_reduce", result["dp_ranks"], numel(bucket) * size)
                   for bucket in buckets] if phase in SYNCED else [])
        check_contract(calls, wanted, f"[{where}] {phase}", rank=rank, formula=FORMULA)


def check_log(rank, result, case, where):
    """The collectives the student's hooks launched: which group, when, how many, waited."""
    buckets = expected_buckets(case["bucket_bytes"], case["dtype"])
    log, dp_ranks = result["log"], result["dp_ranks"]
    every = [name for bucket in buckets for name in bucket]
    for index, entry in enumerate(log):
        assert entry["ranks"] == dp_ranks, (
            f"[{where}] rank {rank}: {entry['op']} #{index} ({entry['phase']}) ran over ranks "
            f"{entry['ranks']}, not the data-parallel group {dp_ranks}: the wrong group (use "
            "the group the wrapper was given; the other groups train other batches)")
        assert not entry["phase"].endswith("no_sync"), (
            f"[{where}] rank {rank}: a collective ran during no_sync ({entry['phase']}): "
            "all-reducing during no_sync; inside it the hooks must launch nothing, .grad just "
            "accumulates")
    done = [run for run in RUNS if run in result]  # the runs that ended without an error
    for run in done:
        check_buckets_left(rank, result, run, where)
    for run in done:
        if run == NESTED_AND_RAISED:
            check_no_sync_state(rank, log, where)
        launched = [entry for entry in log if entry["phase"].startswith(f"{run}:")]
        after = [entry for entry in launched if entry["phase"].endswith("finish")]
        assert not after or run == DEFERRED, (
            f"[{where}] rank {rank}, {run}: {len(after)} of {len(launched)} all-reduces were "
            "launched after the backward ended (exposed communication, each bucket should leave "
            f"from the hook as its last gradient arrives). {count_evidence(result, run)}")
    check_contracts(rank, result, case, where)
    for run in done:
        launched = [entry for entry in log if entry["phase"].startswith(f"{run}:")]
        assert all(entry["async"] for entry in launched), (
            f"[{where}] rank {rank}, {run}: a blocking all-reduce in a hook stalls the backward "
            "until it is done: launch it with async_op=True and keep the handle")
        pending = [list(bucket) for bucket in buckets]
        for index, entry in enumerate(launched):
            sized = [b for b in pending if numel(b) == entry["numel"]]
            match = [b for b in sized if set(b) <= set(entry["ready"])]
            early = ([f"bucket {sized[0]} left with {len(set(sized[0]) & set(entry['ready']))} "
                      f"of its {len(sized[0])} gradients ready"] if sized else [])
            assert match, (
                f"[{where}] rank {rank}, {run}: all-reduce #{index} ({entry['numel']} elements) "
                f"was launched with only {entry['ready']} ready; the buckets are {pending}. "
                + "".join(f"Evidence: {line}. " for line in early)
                + "Likely cause: a bucket flushed before all its gradients are ready (its count "
                "must reach the number of its gradients first)")
            pending.remove(match[0])
        if len(buckets) > 1 and run != DEFERRED:
            assert len(launched[0]["ready"]) < len(every), (
                f"[{where}] rank {rank}, {run}: the first all-reduce started only once every "
                "gradient was ready: nothing overlaps the backward")
        waited = result[run]["waited"]
        missing = [entry["index"] for entry in launched if not waited[entry["index"]]]
        assert not missing, (
            f"[{where}] rank {rank}, {run}: the handles of all-reduces {missing} were not waited "
            "before the step: waiting on handles missing before the step (until wait() the "
            "tensor may hold the local gradient or half a sum)")


def check_buckets_left(rank, result, run, where):
    """After finish_gradient_sync every bucket is as before any backward."""
    for index, state in enumerate(result[run]["buckets"]):
        kept = [what for what in ("handle", "flat") if state[what]]
        assert state["ready"] == 0, (
            f"[{where}] rank {rank}, {run}: after finish_gradient_sync bucket #{index} still "
            f"has a count of {state['ready']}. Likely cause: the count was not reset after the "
            "previous step (finish_gradient_sync leaves every bucket as before any backward: "
            "nothing counted), so the next backward passes the bucket's size without equalling it")
        assert not kept, (
            f"[{where}] rank {rank}, {run}: after finish_gradient_sync bucket #{index} still "
            f"holds {' and '.join(f'its {what}' for what in kept)}. Likely cause: the bucket was "
            "not put back as before any backward (no handle, no tensor); a handle kept is "
            "waited again, and a backward wholly under no_sync then sends nothing")


def check_no_sync_state(rank, log, where):
    """Run 3: nothing in the outer no_sync; everything in the backward after the exception."""
    nested = [entry for entry in log if entry["phase"] == NESTED]
    assert not nested, (
        f"[{where}] rank {rank}: {len(nested)} all-reduce(s) ran inside an outer no_sync, after "
        "an inner no_sync had ended: the nested no_sync switched synchronisation on when it "
        "ended; leaving a no_sync must put back the state it found (off, inside another "
        "no_sync)")
    synced = [entry for entry in log if entry["phase"] == AFTER_RAISED]
    late = [entry for entry in log if entry["phase"] == f"{NESTED_AND_RAISED}: finish"]
    assert synced or not late, (
        f"[{where}] rank {rank}: after an exception raised inside no_sync (and caught), the "
        f"next backward launched nothing ({len(late)} all-reduces left only at "
        "finish_gradient_sync): synchronisation stayed off after the exception; no_sync must "
        "put back the state it found also when its block raises")


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


# ----------------------------------------------------------------- in the test: the values

def mistakes(members: int, world: int) -> dict:
    """{the usual mistake: (what the message says, what it makes of (the group's mean, this
    rank's own gradient))}; the same keys whatever the sizes, so that cases compare."""
    return {
        "not averaged": (
            f"it is {members} times the mean: averaging forgotten (the all-reduce sums; divide "
            f"by the data-parallel group's size, {members})", lambda mean, own: mean * members),
        "world size": (
            f"divided by the world size {world}, not the data-parallel group's size {members}",
            lambda mean, own: mean * members / world),
        "averaged twice": (
            f"it is the mean divided by the group's size {members} once more: averaged twice "
            "(an all-reduce with ReduceOp.AVG already divides by the group's size; the sum is "
            "divided once)", lambda mean, own: mean / members),
        "own": (
            "it is this rank's own gradient: the group's mean never reached .grad (the averaged "
            "bucket must be copied back into each parameter's .grad, its own slice)",
            lambda mean, own: own),
    }


def close(actual, value, dtype) -> bool:
    return (actual is not None and actual.shape == value.shape
            and torch.allclose(actual.double(), value.double(), **TOLERANCES[dtype]))


def matching(actual, mean, own, members, world, dtype) -> list[str]:
    """The usual mistakes whose gradient ``actual`` is (``own`` None: that one not tried)."""
    return [key for key, (_, wrong) in mistakes(members, world).items()
            if (own is not None or key != "own") and close(actual, wrong(mean, own), dtype)]


def sweep_wide(results, cases, seed, world) -> set:
    """The usual mistakes that explain the first step's gradients on every rank of every
    case of the sweep (a mistake that gives the right numbers in a case explains it too)."""
    found = None
    for case in cases:
        for per_case in results:
            result = per_case[label(case, seed)]
            if result.get("step 0") is None:
                continue
            members = len(result["dp_ranks"])
            right = single_device(seed, case["dtype"], result["group"], members)
            mean, own = right["step 0"]["grads"], right["own"][result["member"]]
            for name, actual in result["step 0"]["grads"].items():
                here = set(matching(actual, mean[name], own[name], members, world,
                                    case["dtype"]))
                found = here if found is None else found & here
    return found or set()


def likely_cause(actual, value, own, members, world, dtype, everywhere) -> str:
    """The mistake that explains this gradient: one that explains every case of the sweep
    where one does, else the ones that match here."""
    here = matching(actual, value, own, members, world, dtype)
    texts = mistakes(members, world)
    chosen = [key for key in here if key in everywhere]
    if chosen:
        return texts[chosen[0]][0] + " (this mistake explains every case of the sweep)"
    if here:
        return " or ".join(texts[key][0] for key in here)
    return ("is the sum waited for and copied back into each .grad, in the bucket's order, "
            "with each gradient's own slice?")


def check_values(rank, result, case, where, everywhere, seed, world):
    dtype, members = case["dtype"], len(result["dp_ranks"])
    right = single_device(seed, dtype, result["group"], members)
    for run in RUNS:
        for name, value in right[run]["grads"].items():
            actual = result[run]["grads"][name]
            what = f"[{where}] {run}: {name}.grad after finish_gradient_sync"
            assert actual is not None, f"{what} on rank {rank} is None"
            assert str(actual.dtype) == str(DTYPES[dtype]), (
                f"{what} on rank {rank} is {actual.dtype}, the parameter {DTYPES[dtype]}: each "
                ".grad keeps its parameter's dtype (copy the bucket's values into it)")
            if close(actual, value, dtype):
                continue
            own = right["own"][result["member"]][name] if run == "step 0" else None
            cause = likely_cause(actual, value, own, members, world, dtype, everywhere)
            if "averaged twice" in cause and any(e["reduce"] == "AVG" for e in result["log"]):
                cause += "; this rank's all-reduces asked for ReduceOp.AVG"
            assert_close(actual, value, what, rank=rank,
                         against="one device on the group's whole batch", likely_cause=cause,
                         **TOLERANCES[dtype])
        for name, value in right[run].get("weights", {}).items():
            assert_close(result[run]["weights"][name], value,
                         f"[{where}] {run}: {name} after SGD", rank=rank,
                         likely_cause="the gradients were right: is every handle waited and "
                                      "copied back before the step?", **TOLERANCES[dtype])


def check_sweep(run_on_ranks, impl, seed, cases, world=WORLD, sizes=DP_SIZES):
    """Run ``cases`` on ``world`` ranks and check every one (the log, then the values)."""
    results = run_on_ranks(ddp_on_rank, world, impl, seed, cases, world, sizes, timeout=TIMEOUT)
    everywhere = sweep_wide(results, cases, seed, world)
    for case in cases:
        where = label(case, seed)
        for rank, found in enumerate(results):
            result = found[where]
            check_log(rank, result, case, where)
            assert result["error"] is None, (
                f"[{where}] rank {rank}: OverlappingDataParallel on the data-parallel group "
                f"{result['dp_ranks']} raised {result['error']}")
            check_values(rank, result, case, where, everywhere, seed, world)


def test_ddp_from_hooks_matches_one_device_and_overlaps(impl, run_on_ranks, sweep_seed):
    check_sweep(run_on_ranks, impl, sweep_seed, sweep_cases(sweep_seed))
