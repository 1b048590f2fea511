"""Lab 8, graded: ring attention (``ring_attention.py``; Liu et al. 2023), forward and backward,
on the ranks, against single-device causal attention computed here in float64.

What is swept (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws other cases, and every
failure prints its seed and case):

* **CP groups**, every group of a layout at once, each on its own sequence: on 4 ranks cp = 1,
  cp = 2 consecutive ({0, 1}, {2, 3}), strided ({0, 2}, {1, 3}) and permuted, and cp = 4 (the
  world), on the 4 GPUs the lab needs. Group ranks are not global ranks, and the ring's
  neighbours are the next and previous ranks *of the group*.
* **Cases**, drawn for each layout so that every value appears: (batch, heads, kv_heads) (3, 4, 2),
  (1, 4, 1), (2, 2, 2) (grouped-query attention); 1, 2 or 3 tokens per chunk (the sequence is
  2cp chunks, load-balanced); numbers fp32, bf16, fp32
  with scores near 95 (lse 95 to 130: exp overflows fp32 above 88.7, so only a stable merge
  survives), and bf16 with scores near 50 (q and k small integers with a common component 10,
  so bf16 holds every score exactly, and lse 44 to 60, where bf16's spacing is 0.25: running
  statistics kept in bf16 instead of fp32 show; checked after every other case).

Each case runs twice on the same ranks: **the ring alone**, with ``token_positions`` and
``visible_part`` read from the layout's snapshot (``tests/labs/snapshots/lab8.pt``: the
reference's results, recorded) and the submission's own ``merge_partials`` and
``backward_step``, then **composed** with the submission's own four. Each rank also hands back
what its own ``visible_part``, ``token_positions`` and ``merge_partials`` give on the case's
arguments: a merge that is wrong on its own is named before any value of the ring is
checked, and a composed run that differs blames the unit that is wrong (``backward_step``
alone: ``test_lab8_ring_backward.py``). No working unit is written here: a stand-in would be
an answer.

Checks, in this order, each failure naming the function, the rank, the case (with its seed)
and the likely cause:

1. **Exchanges, as they are posted**: every send and receive goes to the ring's next rank and
   comes from its previous one, in the CP group, never the rank itself, with a buffer of the
   size the ring moves. Anything else is refused before it reaches gloo (where it would hang, or
   die with "Pair is not connected" or SIGABRT "Received data size doesn't match"), and the
   refusal names it; a rank that still dies inside gloo is explained from gloo's words.
2. **The communication contract** (``comm_contract.check_contract``), forward and backward on
   every rank: forward, cp - 1 exchanges of the K/V block (an isend to the next rank, an irecv
   from the previous, 2 x batch x kv_heads x seq/cp x head_dim elements in the inputs' dtype);
   backward, cp - 1 such K/V exchanges and cp - 1 of the fp32 dK/dV blocks (each block's dK/dV
   gathering the ranks' shares on its way home), and dQ never sent. An extra exchange (one at
   the last step), a missing one, or one over another group fails.
3. **The ring's order** in the forward: (post, compute, wait) x (cp - 1), then compute, with
   ``block_attention`` called once per step.
4. **Values** of the ring alone, then composed: the output and dq, dk, dv of every rank
   against its tokens' share of float64 causal attention on the whole sequence (autograd of
   the single-device attention), naming the usual mistakes: dK/dV that never travel home (the
   rank's own share only), dQ of the last block only. Tolerances
   (atol = rtol, the smallest that passes observed on the reference at seed 0 in brackets): fp32
   1e-5 (9e-7), bf16 0.08 (0.024, in dq), fp32 with scores near 95: 1e-3 (1.6e-4, in the
   gradients: the lifted q and k make them large), bf16 with scores near 50, per value (the
   largest error |found - right| / (1 + |right|) of the reference over seeds 0 to 7, public
   and hidden cases, in brackets): out 0.02 (0.0056), dq 0.5 (0.22: along the common
   direction dq is a sum of bf16-rounded terms that cancel), dk 0.25 (0.11), dv 0.05
   (0.014); running statistics kept in bf16 are off by 0.06 to 0.1, 0.9 to 1.2, 0.46 to 1.3
   and 0.17 to 0.27 (but for out and dq at cp 1: one block, nothing merged).
   The units' merge on a sample: atol 1e-4, rtol 1e-5 against float64.
"""
import math
import zlib

import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close_naming, matching_mistake
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.comm.rank_failures import LaunchTimeout, RankFailure
from reference_impl.course.sweeps import draw, group_layouts, group_of, label
from reference_impl.model import repeat_kv_heads
from test_lab8_online_softmax import attention_over
from test_lab8_ring_backward import (positions_of, recorded_rows, recorded_visible_part,
                                     replaced, share_through, use_recorded,
                                     visible_pairs)

pytestmark = pytest.mark.lab8

TIMEOUT = 90
HEAD_DIM = 4
CP_SIZES = {4: (1, 2, 4)}  # world -> the CP sizes swept there
SHAPES = ["3x4x2", "1x4x1", "2x2x2"]  # batch x heads x kv_heads
NUMBERS = {"fp32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 8e-2),
           "fp32, scores ~95": (torch.float32, 1e-3),
           "bf16, scores ~50": (torch.bfloat16, {"out": 2e-2, "dq": 0.5, "dk": 0.25, "dv": 5e-2})}
# dtype, atol = rtol (one for all, or {name: tolerance})
LARGE = "fp32, scores ~95"
LARGE_BF16 = "bf16, scores ~50"
LIFT_BF16 = 10  # the common integer component of q and k in LARGE_BF16: scores (100 + small) / 2
CASE_SPACE = {"shape": SHAPES, "chunk": [1, 2, 3], "numbers": list(NUMBERS)}
GRADIENTS = ("dq", "dk", "dv")
MERGE_TOLERANCE = dict(atol=1e-4, rtol=1e-5)  # the units' merge, fp32 against float64
AGAINST = "its tokens' share of single-device causal attention (float64)"
FORMULA = ("forward: cp-1 exchanges of the K/V block, an isend to the next rank of the CP group and "
           "an irecv from the previous, 2*batch*kv_heads*(seq/cp)*head_dim elements each; backward: "
           "cp-1 such K/V exchanges and cp-1 of the fp32 dK/dV blocks")
UNIT_TESTS = {"visible_part": "test_visible_part_covers_exactly_the_causal_pairs",
              "token_positions": "test_token_positions_are_the_places_in_the_whole_sequence",
              "merge_partials": "the tests of test_lab8_online_softmax.py",
              "backward_step": "test_backward_step_alone_matches_autograd"}
ALONE = "the ring alone"
STATISTICS_DTYPE = (
    "Every other case of this run passed, fp32 at scores ~95 and bf16 at small scores too; only "
    "bf16 at large scores fails (q and k are small integers here, so bf16 holds every score "
    "exactly): the likely cause is the running statistics kept in the inputs' dtype, bf16, where "
    "block_attention gives them in fp32 (the running out and lse, and the lse saved for the "
    "backward): bf16 rounds an lse near 50 by up to 0.125, so each block's weight in the merge "
    "and the backward's probabilities are off by up to 13%.")


# ----------------------------------------------------------------- the plan (both sides)

def ring_plan(world: int, seed: int, space: dict = CASE_SPACE) -> list[dict]:
    """Every case of a launch on ``world`` ranks: {config, groups}; the same in the ranks and in
    the test. ``space``: the (shape, chunk, numbers) drawn for each CP layout."""
    plan = []
    for cp in CP_SIZES[world]:
        for layout, groups in group_layouts(world, cp, seed).items():
            draw_seed = zlib.crc32(f"{seed}/{world}/{cp}/{layout}".encode())
            for case in draw(space, draw_seed, extra=1):
                config = {"world": world, "cp": cp, "layout": layout, **case}
                plan.append({"config": config, "groups": groups, "key": label(config, seed),
                             "seed": seed})
    return plan


def case_tensors(config: dict, group_index: int, seed: int):
    """q, k, v and the output gradient of a case for one CP group's whole sequence, on the CPU,
    in the case's dtype. At scores ~95, q and k share a direction that lifts every score."""
    batch, heads, kv_heads = (int(n) for n in config["shape"].split("x"))
    seq = 2 * config["cp"] * config["chunk"]
    generator = torch.Generator().manual_seed(zlib.crc32(f"{label(config, seed)}/{group_index}".encode()))
    q, k, v, upstream = (torch.randn(batch, n, seq, HEAD_DIM, generator=generator)
                         for n in (heads, kv_heads, kv_heads, heads))
    if config["numbers"] == LARGE:
        lift = math.sqrt(95 / math.sqrt(HEAD_DIM))  # every element lifted: q.k / sqrt(d) ~ 95
        q, k = q + lift, k + lift
    if config["numbers"] == LARGE_BF16:  # small integers, so that bf16 holds q.k exactly (< 256)
        q, k = ((t * 0.8).round().clamp(-2, 2) for t in (q, k))
        q[..., 0], k[..., 0] = LIFT_BF16, LIFT_BF16  # a common direction lifts every score to ~50
    dtype = NUMBERS[config["numbers"]][0]
    return [t.to(dtype) for t in (q, k, v, upstream)]


def block_bytes(config: dict) -> tuple[int, int]:
    """The bytes of the K/V block a ring step moves (2 x batch x kv_heads x seq/cp x head_dim
    elements, in the inputs' dtype) and of its fp32 dK/dV block."""
    batch, _, kv_heads = (int(n) for n in config["shape"].split("x"))
    elements = 2 * batch * kv_heads * 2 * config["chunk"] * HEAD_DIM
    size = torch.tensor([], dtype=NUMBERS[config["numbers"]][0]).element_size()
    return elements * size, elements * 4


def message_sizes(config: dict, phase: str) -> dict[int, str]:
    """{bytes: what}: the messages the ring moves in a phase ("forward" or "backward")."""
    kv_bytes, grad_bytes = block_bytes(config)
    sizes = {grad_bytes: "the fp32 dK/dV block"} if phase.endswith("backward") else {}
    return {**sizes, kv_bytes: "the K/V block"}


# ----------------------------------------------------------------- the units, as recorded

def recorded_positions(seq: int, cp: int, rank: int, device=None) -> torch.Tensor:
    return torch.tensor(positions_of(seq, cp, rank), device=device)


RECORDED = {"token_positions": recorded_positions, "visible_part": recorded_visible_part}


# ----------------------------------------------------------------- on every rank

class ExchangeRefused(RuntimeError):
    """A send or receive that would hang the ring or crash gloo, refused before it is posted."""


class RingWatch:
    """This rank's ring exchanges, checked as they are posted (``check``) and logged with the
    waits on them and the calls of ``block_attention`` (``events``), by phase."""

    def __init__(self, members: list[int], config: dict):
        self.me, self.members, self.config = dist.get_rank(), members, config
        index, cp = members.index(self.me), len(members)
        self.peers = {"send": members[(index + 1) % cp], "recv": members[(index - 1) % cp]}
        self.phase, self.events = "", []

    def __enter__(self):
        self.originals = {name: getattr(dist, name)
                          for name in ("batch_isend_irecv", "isend", "irecv", "send", "recv")}

        def batch(operations):
            kinds = {"send": [], "recv": []}
            for operation in operations:
                kind = "send" if "send" in getattr(operation.op, "__name__", "") else "recv"
                self.check(kind, operation.peer, operation.tensor)
                kinds[kind].append(operation.peer)
            sizes = {kind: {op.tensor.numel() * op.tensor.element_size() for op in operations
                            if ("send" in getattr(op.op, "__name__", "")) == (kind == "send")}
                     for kind in ("send", "recv")}
            if sizes["send"] and sizes["recv"] and sizes["send"] != sizes["recv"]:
                raise ExchangeRefused(
                    f"rank {self.me}, {self.phase}: an exchange whose tensor sent has "
                    f"{sorted(sizes['send'])} bytes and whose receive buffer {sorted(sizes['recv'])}: "
                    "in a ring every rank receives a block like the one it sends; gloo aborts the "
                    "receiving rank (SIGABRT, 'Received data size doesn't match'). Likely cause: a "
                    "buffer or a tensor sent of another size or dtype: receive into "
                    "torch.empty_like(the tensor sent) and send it as it is")
            self.events.append({"phase": self.phase, "kind": "post", **kinds})
            return [_LoggedWork(work, self) for work in self.originals["batch_isend_irecv"](operations)]

        def single(name, kind):
            def posted(*args, **kwargs):
                tensor = args[0] if args else kwargs.get("tensor")
                peer = args[1] if len(args) > 1 else kwargs.get("dst" if kind == "send" else "src")
                group = args[2] if len(args) > 2 else kwargs.get("group")
                group_peer = kwargs.get("group_dst" if kind == "send" else "group_src")
                if peer is None and group_peer is not None:
                    peer = dist.get_global_rank(group, group_peer)
                self.check(kind, peer, tensor)
                self.events.append({"phase": self.phase, "kind": "post", "send": [], "recv": [],
                                     kind: [peer]})
                work = self.originals[name](*args, **kwargs)
                return _LoggedWork(work, self) if name.startswith("i") else work
            return posted

        dist.batch_isend_irecv = batch
        for name in ("isend", "irecv", "send", "recv"):
            setattr(dist, name, single(name, "send" if "send" in name else "recv"))
        return self

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(dist, name, original)

    def check(self, kind: str, peer, tensor) -> None:
        where = (f"rank {self.me} (rank {self.members.index(self.me)} of the CP group "
                 f"{self.members}), {self.phase}: a {kind}")
        wanted = self.peers[kind]
        side, to = ("next", "to") if kind == "send" else ("previous", "from")
        if len(self.members) == 1:
            raise ExchangeRefused(
                f"{where} in a CP group of one rank, which has nothing to exchange: a ring of cp "
                "ranks makes cp - 1 exchanges per pass (none at its last step), none at all here")
        if peer == self.me:
            raise ExchangeRefused(
                f"{where} {to} itself (global rank {peer}), where the ring's {side} rank is "
                f"{wanted}; gloo dies on it with 'Pair is not connected'. Likely cause: the "
                "neighbour computed from the global rank (dist.get_rank() modulo cp), which on "
                "strided or permuted CP groups is the rank itself or outside its group: take "
                "dist.get_rank(group), add or subtract 1 modulo cp, and translate back with "
                "dist.get_global_rank(group, ...)")
        if peer not in self.members:
            raise ExchangeRefused(
                f"{where} {to} global rank {peer}, outside the CP group {self.members}: group "
                "ranks are not global ranks (the neighbour is the next rank of the group, "
                "translated with dist.get_global_rank)")
        if peer != wanted:
            turned = self.peers["recv" if kind == "send" else "send"] == peer
            raise ExchangeRefused(
                f"{where} {to} global rank {peer}, where the ring's {side} rank is {wanted}: "
                + ("sent to the previous rank instead of the next (the K/V blocks travel to "
                   "rank r+1 and arrive from r-1, so that at step t a rank holds the block of "
                   "rank r - t)" if turned else "the ring's neighbours are the next and previous "
                   "ranks of the CP group, in its order"))
        nbytes, sizes = tensor.numel() * tensor.element_size(), message_sizes(self.config, self.phase)
        if nbytes not in sizes:
            moved = " or ".join(f"{n} bytes ({what})" for n, what in sizes.items())
            raise ExchangeRefused(
                f"{where} {kind == 'send' and 'of a tensor' or 'into a buffer'} of {nbytes} bytes "
                f"({tensor.dtype}, {tuple(tensor.shape)}), where the ring moves {moved}; gloo "
                "aborts the receiving rank (SIGABRT, 'Received data size doesn't match'). Likely "
                "cause: a buffer of the wrong size or dtype: receive into torch.empty_like(the "
                "tensor sent)")

    def watch_compute(self, module) -> dict:
        """``block_attention`` of the ring's module, logged (for :func:`replaced`)."""
        compute = getattr(module, "block_attention", None)
        if compute is None:
            return {}

        def logged(*args, **kwargs):
            self.events.append({"phase": self.phase, "kind": "compute"})
            return compute(*args, **kwargs)

        return {"block_attention": logged}


class _LoggedWork:
    def __init__(self, work, watch: RingWatch):
        self.work, self.watch = work, watch

    def wait(self, *args, **kwargs):
        self.watch.events.append({"phase": self.watch.phase, "kind": "wait"})
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.work, name)


def attempt(function, *args):
    """``function(*args)`` as data (slices as [start, stop], tensors as themselves); an error
    as text."""
    try:
        value = function(*args)
    except Exception as error:  # named in the test
        return f"{type(error).__name__}: {error}"
    if isinstance(value, tuple):
        return [[each.start, each.stop] if isinstance(each, slice) else
                (each.detach().clone() if isinstance(each, torch.Tensor) else each) for each in value]
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def merge_sample(config: dict, seed: int):
    """Two blocks of keys' partial (out, lse) for one rank's queries, fp32, lse at the case's
    magnitude (query 0 sees no key of either), and attention over both blocks' keys (float64),
    what their merge must give."""
    batch, heads, _ = (int(n) for n in config["shape"].split("x"))
    rows = 2 * config["chunk"]
    generator = torch.Generator().manual_seed(zlib.crc32(f"merge {label(config, seed)}".encode()))
    shift = 95.0 if config["numbers"] == LARGE else 0.0
    scores = torch.randn(batch, heads, rows, 2 * rows, generator=generator, dtype=torch.float64) * 3
    values = torch.randn(batch, heads, 2 * rows, HEAD_DIM, generator=generator, dtype=torch.float64)
    visible = torch.rand(rows, 2 * rows, generator=generator) < 0.7
    visible[0] = False
    first, second = range(rows), range(rows, 2 * rows)
    parts = [t.float() for block in (first, second)
             for t in attention_over(scores + shift, values, visible, block)]
    return parts, attention_over(scores + shift, values, visible, range(2 * rows))


def units_on_rank(modules: dict, config: dict, member: int, seed: int) -> dict:
    """What the submission's own units give on this rank's arguments of the case."""
    cp, local = config["cp"], 2 * config["chunk"]
    balance, softmax = modules["load_balance"], modules["online_softmax"]
    inputs, _ = merge_sample(config, seed)
    kept = [t.clone() for t in inputs]
    merged = attempt(softmax.merge_partials, *inputs)
    overwrote = [name for name, before, after in zip(("out1", "lse1", "out2", "lse2"), kept, inputs)
                 if not torch.allclose(before, after, rtol=0, atol=0, equal_nan=True)]
    return {"visible": {str(owner): attempt(balance.visible_part, cp, member, owner, local)
                        for owner in range(cp)},
            "positions": attempt(balance.token_positions, cp * local, cp, member),
            "merge": merged, "overwrote": overwrote}


def run_ring(ring, q, k, v, upstream, group, watch: RingWatch, how: str) -> dict:
    """One forward and backward of the ring, traced: outputs, gradients and the calls made."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    found = {}
    for phase in ("forward", "backward"):
        watch.phase = f"{how}, {phase}"  # ends with the phase: message_sizes reads it
        with CommTracer() as trace, watch:
            if phase == "forward":
                out = ring.ring_attention(q, k, v, group)
            else:
                out.backward(upstream)
        found[phase] = [call.as_data() for call in trace.calls]
    found.update(out=out.detach().cpu(), dq=q.grad.cpu(), dk=k.grad.cpu(), dv=v.grad.cpu())
    return found


def ring_on_rank(impl, world: int, seed: int, space: dict, rows: dict):
    """Every case of the plan on this rank: {case label: {"alone", "composed", "units"}}, the
    snapshot's ``rows`` standing in for the layout. An error is raised with the case and phase
    named (so that a failing rank ends the launch instead of leaving its peers waiting)."""
    use_recorded(rows)
    rank, device = dist.get_rank(), current_device()
    plan = ring_plan(world, seed, space)
    handles = {}
    for entry in plan:
        for members in entry["groups"]:
            if tuple(members) not in handles:  # every rank creates every group, in one order
                handles[tuple(members)] = dist.new_group(members)
    ring = impl.module("ring_attention")
    modules = {"load_balance": impl.module("load_balance"),
               "online_softmax": impl.module("online_softmax")}
    results = {}
    for entry in plan:
        config, members = entry["config"], group_of(rank, entry["groups"])
        member = members.index(rank)
        whole = case_tensors(config, entry["groups"].index(members), seed)
        mine = positions_of(whole[0].shape[2], config["cp"], member)
        q, k, v, upstream = (t[:, :, mine].to(device) for t in whole)
        found = {"units": units_on_rank(modules, config, member, seed)}
        watch = RingWatch(members, config)
        for how, functions in ((ALONE, {**RECORDED, **watch.watch_compute(ring)}),
                               ("composed", {})):
            try:
                with replaced([ring, *modules.values()], functions):
                    found[how] = run_ring(ring, q, k, v, upstream, handles[tuple(members)], watch, how)
            except Exception as error:
                composed = (" (composed with your own token_positions and visible_part: with "
                            "the snapshot's it ran)" if how == "composed" else "")
                raise RuntimeError(f"[{entry['key']}] {watch.phase}: ring_attention{composed} "
                                   f"raised {type(error).__name__}: {error}") from error
        found["events"] = watch.events
        results[entry["key"]] = found
    return results


# ----------------------------------------------------------------- in the test: crashes

GLOO_CAUSES = {
    "Pair is not connected": (
        "a rank sent to or received from itself (gloo has no connection from a rank to itself): "
        "the ring's neighbour computed from the global rank modulo cp lands on the rank itself "
        "on strided or permuted CP groups; use dist.get_rank(group) and dist.get_global_rank"),
    "Received data size doesn't match": (
        "a receive buffer smaller than the message sent to it: receive into "
        "torch.empty_like(the tensor sent)"),
    "SIGABRT": (
        "a rank died inside gloo (SIGABRT): most often a receive buffer of another size than "
        "the message sent to it ('Received data size doesn't match'): receive into "
        "torch.empty_like(the tensor sent)"),
    "is not part of group": (
        "a peer outside the CP group: P2POp takes global ranks, so the group rank of the "
        "neighbour must be translated with dist.get_global_rank(group, ...)"),
    "Invalid ``op``": (
        "P2POp was given dist.isend or dist.irecv, which the test's tracer wraps: pass "
        "torch.distributed.distributed_c10d.isend / irecv, as the comment above the exercise "
        "says"),
}


def crash_cause(error: Exception) -> str:
    """A failed or hung launch, with the likely cause of a crash inside gloo named."""
    text = str(error)
    if isinstance(error, LaunchTimeout):
        return (f"ring_attention hung: {text}\nLikely cause: the ranks of a CP group do not post "
                "matching exchanges (as many on every rank, each send matched by the receive of "
                "the next rank of the group)")
    if isinstance(error, RankFailure) and "ExchangeRefused" in error.summary:
        return f"rank {error.rank}: {error.summary}"  # already names its cause
    first, _, rest = text.partition("\n")  # the failing rank's own error, then its peers'
    causes = [cause for part in (first, text) for words, cause in GLOO_CAUSES.items() if words in part]
    if not causes and "composed, " in first:
        causes = ["one of your units gives what the ring cannot use here (it ran with the "
                  f"snapshot's positions and visible parts): see {', '.join(UNIT_TESTS.values())}"]
    found = f"\nLikely cause: {causes[0]}" if causes else ""
    return f"{first}{found}\n{rest[:6000]}"


# ----------------------------------------------------------------- in the test: expected values

def owners(seq: int, cp: int) -> torch.Tensor:
    """The CP rank holding each position of the sequence."""
    owner = torch.empty(seq, dtype=torch.long)
    for rank in range(cp):
        owner[positions_of(seq, cp, rank)] = rank
    return owner


def masked_attention(q, k, v, visible):
    """softmax(q k^T / sqrt(d), hidden where not ``visible``) v, with grouped-query heads; a
    row that sees nothing gives 0."""
    heads = q.shape[1]
    k, v = repeat_kv_heads(k, heads), repeat_kv_heads(v, heads)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~visible, float("-inf"))
    return torch.nan_to_num(scores.softmax(dim=-1), nan=0.0) @ v


def usual_mistakes(q, k, v, cp):
    """{the mistake: the whole output it gives}, on one device (float64)."""
    seq = q.shape[2]
    positions, owner = torch.arange(seq), owners(seq, cp)
    causal = positions[None, :] <= positions[:, None]
    same = owner[None, :] == owner[:, None]
    earlier, later = owner[None, :] < owner[:, None], owner[None, :] > owner[:, None]
    unscaled = sum(masked_attention(q, k, v, causal & (owner[None, :] == source))
                   for source in range(cp))
    return {
        "the diagonal block was not masked: a rank's own K/V block is causal inside (its first "
        "chunk's queries do not see its second chunk's keys)": masked_attention(q, k, v, causal | same),
        "the block from rank r-1 (an earlier rank) was treated as fully visible: only its first "
        "chunk comes before this rank's tokens, its second chunk after both of "
        "them": masked_attention(q, k, v, causal | earlier),
        "a later rank's block was treated as fully visible: this rank's first chunk sees none of "
        "it, only its second chunk sees it, whole": masked_attention(q, k, v, causal | later),
        "the partial outputs were added without rescaling: each block's out is "
        "normalised over that block's keys only (merge_partials merges them)": unscaled,
    }


def expected_of(config: dict, group_index: int, seed: int):
    """Single-device causal attention on the whole sequence, float64: {out, dq, dk, dv}, and
    the inputs q, k, v and the output's gradient (float64)."""
    q, k, v, upstream = (t.double() for t in case_tensors(config, group_index, seed))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    positions = torch.arange(q.shape[2])
    out = masked_attention(*leaves, positions[None, :] <= positions[:, None])
    out.backward(upstream)
    return ({"out": out.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad},
            (q, k, v, upstream))


def wanted_calls(config: dict, members: list[int], rank: int) -> dict[str, list]:
    """The contract of one rank: {phase: the operations the formula asks for}."""
    cp, index = config["cp"], members.index(rank)
    following, preceding = members[(index + 1) % cp], members[(index - 1) % cp]
    kv_bytes, grad_bytes = block_bytes(config)

    def exchanges(nbytes):
        return [expected("isend", members, nbytes, following), expected("irecv", members, nbytes, preceding)]

    steps = cp - 1
    return {"forward": exchanges(kv_bytes) * steps,
            "backward": (exchanges(kv_bytes) + exchanges(grad_bytes)) * steps}


# ----------------------------------------------------------------- in the test: the checks

def where_of(entry: dict, rank: int) -> tuple[str, list[int]]:
    members = group_of(rank, entry["groups"])
    return (f"[{entry['key']}] CP group {members}: ring_attention", members)


def check_contract_of(entry, rank, found) -> None:
    what, members = where_of(entry, rank)
    for phase, wanted in wanted_calls(entry["config"], members, rank).items():
        check_contract(found[ALONE][phase], wanted, f"{what}'s {phase}", rank=rank,
                       formula=FORMULA)


def check_order(entry, rank, found) -> None:
    """(post compute wait) x (cp - 1), then compute, in the forward of the ring alone."""
    what, _ = where_of(entry, rank)
    cp, phase = entry["config"]["cp"], f"{ALONE}, forward"
    kinds = [event["kind"] for event in found["events"] if event["phase"] == phase]
    kinds = [kind for i, kind in enumerate(kinds) if i == 0 or (kind, kinds[i - 1]) != ("wait", "wait")]
    computes = kinds.count("compute")
    assert computes == cp, (
        f"{what} on rank {rank} called block_attention {computes} times in a forward of cp = {cp} "
        "steps: one call per step, on the visible part of the block held then")
    if kinds == ["post", "compute", "wait"] * (cp - 1) + ["compute"]:
        return
    if kinds[0] == "compute" and cp > 1:
        cause = ("the next block's transfer was posted after this block's compute: post it first, "
                 "so that it travels while the block is computed")
    elif kinds[:3] == ["post", "wait", "compute"]:
        cause = "the transfer was waited for before this block's compute: wait after it, or nothing hides it"
    else:
        cause = "post the next block's transfer, compute this block, then wait"
    raise AssertionError(f"{what} on rank {rank}, forward: the ring's steps ran as {' '.join(kinds)}, "
                         f"not (post compute wait) x {cp - 1} then compute: {cause}")


def compare(result, entry, rank, expected_values, inputs, otherwise, blame_units=False,
            names=("out",) + GRADIENTS) -> None:
    """The output or dq, dk, dv (``names``) of one run against the rank's share of
    ``expected_values``."""
    what, members = where_of(entry, rank)
    config = entry["config"]
    tolerances = NUMBERS[config["numbers"]][1]
    mine = positions_of(inputs[0].shape[2], config["cp"], members.index(rank))
    for name in names:
        tolerance = tolerances[name] if isinstance(tolerances, dict) else tolerances
        actual, wanted = result[name], expected_values[name][:, :, mine]
        if torch.allclose(actual.double(), wanted, atol=tolerance, rtol=tolerance):
            continue
        if name == "out":
            known = {cause: out[:, :, mine]
                     for cause, out in usual_mistakes(*inputs[:3], config["cp"]).items()}
        else:
            known = gradient_mistakes(name, inputs, config["cp"], members.index(rank))
        if blame_units:  # the mistake the values show, and the unit that made it
            mistake = matching_mistake(actual, known, tolerance)
            otherwise, known = (f"{mistake}; {otherwise}" if mistake else otherwise), {}
        hint = otherwise if name == "out" or blame_units else (
            "the output is right but the gradients are not: the backward recomputes each block's "
            "probabilities from the lse the forward saved, so the merged lse must be kept, merged "
            "at every step like out; dq sums the queries' gradients through every block, and "
            "each block's dk, dv sum the shares of every rank the block visits, brought home to its owner")
        if config["numbers"] == LARGE_BF16:  # checked after every other case of the run passed
            hint = STATISTICS_DTYPE
        elif config["cp"] == 1 and name != "out" and not blame_units:
            hint = ("the output is right but the gradients are not, with cp = 1: nothing is "
                    "exchanged or merged, so the gradients are backward_step's on the rank's own "
                    "block (the same visible part and causal mask as the forward's, the lse it "
                    "saved); test_lab8_ring_backward.py checks backward_step alone")
        assert_close_naming(actual, wanted, f"{what}'s {name}", rank=rank, against=AGAINST,
                            mistakes=known, otherwise=hint, atol=tolerance, rtol=tolerance)


def gradient_mistakes(name: str, inputs, cp: int, member: int) -> dict:
    """{the mistake: the gradient ``name`` it gives this rank}, from autograd of the
    single-device attention (float64)."""
    if cp == 1:
        return {}
    seq = inputs[0].shape[2]
    mine = positions_of(seq, cp, member)
    if name == "dq":
        last = positions_of(seq, cp, (member + 1) % cp)  # the block held at the last step
        return {"dq holds the queries' gradient through the last block held only: it must sum "
                "their gradients through every block of the ring (each step adds to it)":
                share_through(*inputs, mine, last)[0]}
    own = share_through(*inputs, mine, mine)[GRADIENTS.index(name)]
    return {f"{name} holds only this rank's own queries' share of its block's gradient: the "
            "other ranks' shares, summed as the block's dK/dV travels round the ring behind it, "
            "never came home (add what arrives after the last step to the share kept from "
            "step 0)": own}


def visible_part_is_right(part, cp: int, local: int, rank: int, owner: int) -> bool:
    """The slices hold every visible pair; unmasked, nothing else; masked only on the rank's own
    block (the ring masks with this rank's positions for queries and keys)."""
    (rows, keys, masked), truth = part, visible_pairs(cp, local, rank, owner)
    covered = torch.zeros_like(truth)
    covered[slice(*rows), slice(*keys)] = True
    if (truth & ~covered).any():
        return False
    return owner == rank if masked else not (covered & ~truth).any()


def wrong_units(entry, rank, units) -> list[str]:
    """The submission's units that give other values than they must on this rank's arguments."""
    config = entry["config"]
    cp, local = config["cp"], 2 * config["chunk"]
    member = group_of(rank, entry["groups"]).index(rank)
    wrong = []
    for owner in range(cp):
        part, call = units["visible"][str(owner)], f"visible_part({cp}, {member}, {owner}, {local})"
        if isinstance(part, str):
            wrong.append(f"{call} raised {part}")
            continue
        if not visible_part_is_right(part, cp, local, member, owner):
            rows, keys, masked = part
            wrong.append(f"{call} = (rows {rows}, keys {keys}, masked {masked}) does not cover "
                         "exactly the pairs with key position <= query position")
    seq = cp * local
    positions, right = units["positions"], positions_of(seq, cp, member)
    if isinstance(positions, str) or torch.as_tensor(positions).tolist() != right:
        wrong.append(f"token_positions({seq}, {cp}, {member}) = {summary(positions)}, not "
                     f"{right}")
    if units["overwrote"]:
        wrong.append(f"merge_partials overwrote its caller's input {', '.join(units['overwrote'])}")
    merged = units["merge"]
    if isinstance(merged, str):
        wrong.append(f"merge_partials raised {merged}")
    else:
        _, (out, lse) = merge_sample(config, entry["seed"])
        seen = lse > float("-inf")
        if not (torch.allclose(merged[0].double()[seen], out[seen], **MERGE_TOLERANCE)
                and torch.allclose(merged[1].double()[seen], lse[seen], **MERGE_TOLERANCE)
                and bool((merged[1][~seen] == float("-inf")).all())):
            wrong.append("merge_partials gives another (out, lse) than the online-softmax merge "
                         f"(on partial results whose lse is near {lse[lse.isfinite()].mean():.0f})")
    return wrong


def check_merge_first(entry, rank, found) -> None:
    """The ring alone runs with the submission's merge: a merge wrong on its own is named
    before any value of the ring, which it would spoil."""
    wrong = [each for each in wrong_units(entry, rank, found["units"])
             if each.startswith("merge_partials")]
    assert not wrong, (f"[{entry['key']}] rank {rank}: {wrong[0]} ({UNIT_TESTS['merge_partials']}); "
                       "the ring's values are checked once merge_partials is right: it merges "
                       "every block")


def summary(value) -> str:
    if isinstance(value, torch.Tensor):
        shown = value.tolist()
        return str(shown) if len(shown) <= 16 else f"a tensor of {value.numel()} positions"
    return str(value)[:200]


def check_composed(entry, rank, found, expected_values, inputs, names) -> None:
    """The ring with the submission's own units, once the ring alone is right."""
    wrong = wrong_units(entry, rank, found["units"])
    if wrong:
        units = [name for name in UNIT_TESTS if any(w.startswith(name) for w in wrong)]
        otherwise = (f"the ring is right with the snapshot's positions and visible parts, so "
                     f"the unit is wrong, not the ring: {'; '.join(wrong[:3])} (see "
                     f"{', '.join(UNIT_TESTS[name] for name in units)}).")
    else:
        otherwise = ("the ring is right with the snapshot's token_positions and visible_part, "
                     "and yours give the right values on their own: does the ring hand them the "
                     "arguments it hands the recorded ones (this rank's positions, each owner's "
                     "block), and keep what they return?")
    compare(found["composed"], entry, rank, expected_values, inputs, otherwise,
            blame_units=bool(wrong), names=names)


def check_world(world: int, impl, run_on_ranks, seed: int, space: dict = CASE_SPACE) -> None:
    """The ring on ``world`` ranks, every CP layout, cases drawn from ``space``: launched, then
    checked (contract, order, values alone, values composed)."""
    try:
        rows = recorded_rows(CP_SIZES[world], space["chunk"])
        results, failure = run_on_ranks(ring_on_rank, world, impl, world, seed, space, rows,
                                        timeout=TIMEOUT), ""
    except (RankFailure, LaunchTimeout) as error:
        failure = crash_cause(error)
    if failure:  # outside the except: the launcher's error is not printed again above it
        pytest.fail(failure, pytrace=False)
    try:
        check_results(results, world, seed, space)
    except AssertionError as error:  # the message says it all; no frames of the test's helpers
        failure = str(error).split("\nassert ")[0]  # nor pytest's rewritten operands
    if failure:
        pytest.fail(failure, pytrace=False)


def check_results(results, world: int, seed: int, space: dict) -> None:
    """Every rank's exchanges, then its order, then the values of the ring alone, then
    composed (a wrong exchange shows in the values too: the exchange names it better)."""
    plan = ring_plan(world, seed, space)
    for check in (check_contract_of, check_order, check_merge_first):
        for entry in plan:
            for rank in range(world):
                check(entry, rank, results[rank][entry["key"]])
    # bf16 at large scores last: failing only there names the running statistics' dtype
    plan.sort(key=lambda entry: entry["config"]["numbers"] == LARGE_BF16)
    for how in (ALONE, "composed"):
        for entry in plan:
            for names in (("out",), GRADIENTS):  # every rank's output first: it names a mistake best
                check_values(results, entry, how, names, world, seed)


def check_values(results, entry, how: str, names, world: int, seed: int) -> None:
    """``names`` of one run (``how``) of a case, on every rank."""
    expected_by_group = {}
    for rank in range(world):
        members = group_of(rank, entry["groups"])
        index = entry["groups"].index(members)
        if index not in expected_by_group:
            expected_by_group[index] = expected_of(entry["config"], index, seed)
        expected_values, inputs = expected_by_group[index]
        found = results[rank][entry["key"]]
        if how == "composed":
            check_composed(entry, rank, found, expected_values, inputs, names)
            continue
        compare(found[how], entry, rank, expected_values, inputs, names=names, otherwise=(
            "the ring itself (the snapshot's token_positions and visible_part stood in for "
            "yours, and your merge_partials is right on its own): at step t a rank holds the "
            "K/V block of rank r - t (the blocks travel to the next rank); "
            + ("is its visible part taken for that owner, and merged into the running (out, lse)?"
               if names == ("out",) else "is backward_step right on its own "
               f"({UNIT_TESTS['backward_step']})? Then: is that owner handed to backward_step, "
               "the step's dq added to the rank's, and the step's dK/dV added to what arrived "
               "for that block before it is passed on?")))


def test_ring_attention_on_4_ranks_matches_one_device(impl, run_on_ranks, sweep_seed):
    check_world(4, impl, run_on_ranks, sweep_seed)

