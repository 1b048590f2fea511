"""Lab 8, graded: ring attention (``ring_attention.py``; Liu et al. 2023), forward and backward,
on the ranks, against single-device causal attention.

* **Two CP groups at once**: 4 ranks, the CP groups {0, 1} and {2, 3}, each with its own
  sequence (a group that is not the world: group ranks are not global ranks).
* **cp = 4**: one group of the 4 ranks (with cp = 2 the next rank is also the previous one;
  with 4 they differ).

Each launch runs two cases with grouped-query attention and sizes that do not divide evenly
where the code allows it: batch 3 with heads 4 and kv_heads 2, and batch 1 with heads 4 and
kv_heads 1, the sequence in 2cp chunks of 3 tokens (odd). Each rank holds its tokens in the
load-balanced layout (chunks i and 2cp-1-i, written out in ``reference_impl/toys.py``). The output and
dq, dk, dv of every rank must be its share of ``causal_attention``'s on the whole sequence,
computed here in pytest's process with autograd (fp32, atol = rtol = 1e-5; observed within
5e-7).

Before the submission is loaded, each rank starts recording its ring exchanges
(``batch_isend_irecv``: the peers of every send and receive) and, once it is loaded, the
calls of ``block_attention`` and the waits on the transfers: so a failure is named from what
the ranks did (a block sent to the previous rank, a transfer posted after the compute it
should hide behind, waited for before it) and, where the values are wrong, from the mistakes
whose results the test computes on one device (a visible part of the wrong size, partial
outputs summed without rescaling).
"""
import math

import pytest
import torch
import torch.distributed as dist

from reference_impl.attention import causal_attention
from reference_impl.checks import assert_close_naming
from reference_impl.comm.device import current_device
from reference_impl.model import repeat_kv_heads
from reference_impl.toys import head_tail_positions

pytestmark = pytest.mark.lab8

WORLD, TIMEOUT = 4, 120
CASES = [(3, 4, 2), (1, 4, 1)]  # (batch, heads, kv_heads); head_dim 4, chunks of 3 tokens
HEAD_DIM, CHUNK = 4, 3
TOLERANCE = dict(atol=1e-5, rtol=1e-5)
GRADIENTS = ("dq", "dk", "dv")
AGAINST = "its tokens' share of single-device causal_attention"


def case_tensors(case, group_index: int, cp: int):
    """The whole q, k, v and output gradient of a case, on the CPU, for one group's sequence."""
    batch, heads, kv_heads = case
    seq = 2 * cp * CHUNK
    generator = torch.Generator().manual_seed(100 * group_index + 10 * CASES.index(case) + cp)
    return [torch.randn(batch, n, seq, HEAD_DIM, generator=generator)
            for n in (heads, kv_heads, kv_heads, heads)]


# ----------------------------------------------------------------- on every rank

class RingLog:
    """This rank's ring exchanges (``batch_isend_irecv``: the global peers of its sends and
    receives), the waits on them and the calls of the ring module's ``block_attention``, each
    with the phase of the run (``phase``), in order."""

    def __init__(self):
        self.phase, self.events = "loading", []

    def __enter__(self):
        self.original = dist.batch_isend_irecv

        def logged(operations):
            kinds = {"send": [], "recv": []}
            for operation in operations:
                name = getattr(operation.op, "__name__", "")
                kinds["send" if "send" in name else "recv"].append(operation.peer)
            self.events.append({"phase": self.phase, "kind": "post", **kinds})
            return [_LoggedWork(work, self) for work in self.original(operations)]

        dist.batch_isend_irecv = logged
        return self

    def __exit__(self, *exc):
        dist.batch_isend_irecv = self.original

    def watch_compute(self, module) -> None:
        compute = getattr(module, "block_attention", None)
        if compute is None:
            return

        def logged(*args, **kwargs):
            self.events.append({"phase": self.phase, "kind": "compute"})
            return compute(*args, **kwargs)

        module.block_attention = logged


class _LoggedWork:
    def __init__(self, work, log: RingLog):
        self.work, self.log = work, log

    def wait(self, *args, **kwargs):
        self.log.events.append({"phase": self.log.phase, "kind": "wait"})
        return self.work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.work, name)


def ring_on_rank(impl, groups):
    rank, device = dist.get_rank(), current_device()
    handles = [dist.new_group(members) for members in groups]
    index = next(i for i, members in enumerate(groups) if rank in members)
    members, group = groups[index], handles[index]
    cp, member = len(members), members.index(rank)
    found = {"members": members, "member": member, "results": []}
    with RingLog() as log:
        try:
            ring = impl.module("ring_attention")
            log.watch_compute(ring)
            for number, case in enumerate(CASES):
                whole = case_tensors(case, index, cp)
                mine = head_tail_positions(whole[0].shape[2], cp, member)
                q, k, v, upstream = (t[:, :, mine].to(device) for t in whole)
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                log.phase = f"case {number}, forward"
                out = ring.ring_attention(q, k, v, group)
                log.phase = f"case {number}, backward"
                out.backward(upstream)
                found["results"].append({"out": out.detach().cpu(), "dq": q.grad.cpu(),
                                         "dk": k.grad.cpu(), "dv": v.grad.cpu()})
        except Exception as error:  # named in the test, with what the ring did
            found["error"] = f"{type(error).__name__}: {error}"
    found["events"] = log.events
    return found


# ----------------------------------------------------------------- in the test

def owners(seq: int, cp: int) -> torch.Tensor:
    """The CP rank holding each position of the sequence."""
    owner = torch.empty(seq, dtype=torch.long)
    for rank in range(cp):
        owner[head_tail_positions(seq, cp, rank)] = rank
    return owner


def masked_attention(q, k, v, visible):
    """softmax(q k^T / sqrt(d), hidden where not ``visible``) v, with grouped-query heads; a
    row that sees nothing gives 0."""
    heads = q.shape[1]
    k, v = repeat_kv_heads(k, heads), repeat_kv_heads(v, heads)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~visible, float("-inf"))
    return torch.nan_to_num(scores.softmax(dim=-1), nan=0.0) @ v


def usual_mistakes(q, k, v, cp):
    """{the mistake: the whole output it gives}, on one device."""
    seq = q.shape[2]
    positions, owner = torch.arange(seq), owners(seq, cp)
    causal = positions[None, :] <= positions[:, None]
    same = owner[None, :] == owner[:, None]
    earlier, later = owner[None, :] < owner[:, None], owner[None, :] > owner[:, None]
    unscaled = sum(masked_attention(q, k, v, causal & (owner[None, :] == source))
                   for source in range(cp))
    return {
        "the diagonal block was not masked: a rank's own K/V block is causal inside (its first "
        "chunk's queries do not see its second chunk's keys); mask it by the tokens' global "
        "positions": masked_attention(q, k, v, causal | same),
        "the block from rank r-1 (an earlier rank) was treated as fully visible: only its first "
        "chunk comes before this rank's tokens, its second chunk (2cp-1-owner) after both of "
        "them": masked_attention(q, k, v, causal | earlier),
        "a later rank's block was treated as fully visible: this rank's first chunk sees none of "
        "it, only its second chunk sees it, whole": masked_attention(q, k, v, causal | later),
        "the partial outputs were added without rescaling by exp(lse_i - lse): each block's out is "
        "normalised over that block's keys only (merge_partials merges them)": unscaled,
    }


def ring_evidence(found, cp: int, group_ranks: list[int]) -> str | None:
    """A mistake named from the ring's exchanges and their order, or None."""
    rank_in_group = found["member"]
    following, preceding = group_ranks[(rank_in_group + 1) % cp], group_ranks[(rank_in_group - 1) % cp]
    where = f"rank {group_ranks[rank_in_group]} (rank {rank_in_group} of the CP group {group_ranks})"
    for event in found["events"]:
        if event["kind"] != "post":
            continue
        for peer in event["send"] + event["recv"]:
            if peer not in group_ranks:
                return (f"{where}, {event['phase']}: exchanged with global rank {peer}, outside the "
                        "CP group: group ranks are not global ranks (translate them, as "
                        "global_rank does)")
        if "forward" in event["phase"] and cp > 2:
            if event["send"] == [preceding] or event["recv"] == [following]:
                return (f"{where}, {event['phase']}: sent to the previous rank instead of the next "
                        f"(sent to {event['send']}, received from {event['recv']}): the K/V blocks "
                        f"travel to rank r+1 ({following}) and arrive from r-1 ({preceding}), so "
                        "that at step t a rank holds the block of rank r - t")
    for number in range(len(CASES)):
        phase = f"case {number}, forward"
        kinds = [event["kind"] for event in found["events"] if event["phase"] == phase]
        kinds = [kind for i, kind in enumerate(kinds) if i == 0 or (kind, kinds[i - 1]) != ("wait", "wait")]
        if kinds.count("compute") != cp or kinds.count("post") != cp - 1:
            continue  # the blocks computed without block_attention, or the run stopped early
        if kinds != ["post", "compute", "wait"] * (cp - 1) + ["compute"]:
            first = kinds[: kinds.index("compute") + 2]
            if kinds[0] == "compute":
                cause = ("the next block's transfer was posted after this block's compute: post it "
                         "first, so that it travels while the block is computed")
            elif first[:3] == ["post", "wait", "compute"]:
                cause = ("the transfer was waited for before this block's compute: wait after it, "
                         "or nothing hides the transfer")
            else:
                cause = "post the next block's transfer, compute this block, then wait"
            return (f"{where}, {phase}: the ring's steps ran as {' '.join(kinds)}, not (post "
                    f"compute wait) x {cp - 1} then compute: {cause}")
    return None


def expected_of(case, group_index: int, cp: int):
    """Single-device causal attention on the whole sequence: {out, dq, dk, dv} and the inputs."""
    q, k, v, upstream = case_tensors(case, group_index, cp)
    heads = q.shape[1]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = causal_attention(leaves[0], repeat_kv_heads(leaves[1], heads), repeat_kv_heads(leaves[2], heads))
    out.backward(upstream)
    return ({"out": out.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad},
            (q, k, v))


def check_ring(results, groups):
    """Every rank's exchanges, then every output, then every gradient (a wrong forward shows in
    the gradients too: the output names it better)."""
    compared = []
    for rank, found in enumerate(results):
        members = found["members"]
        cp, group_index = len(members), groups.index(members)
        evidence = ring_evidence(found, cp, members)
        assert evidence is None, evidence
        assert "error" not in found, (
            f"rank {rank} (CP group {members}): ring_attention raised {found['error']}")
        for case, result in zip(CASES, found["results"]):
            expected, (q, k, v) = expected_of(case, group_index, cp)
            mine = head_tail_positions(q.shape[2], cp, found["member"])
            what = (f"CP group {members} (cp = {cp}), batch {case[0]}, heads {case[1]}, kv_heads "
                    f"{case[2]}, seq {q.shape[2]}: ring_attention's")
            mistakes = {cause: out[:, :, mine] for cause, out in usual_mistakes(q, k, v, cp).items()}
            assert_close_naming(
                result["out"], expected["out"][:, :, mine], f"{what} output", rank=rank, against=AGAINST,
                mistakes=mistakes, otherwise=(
                    "at step t a rank holds the K/V block of rank r - t (the blocks travel to the "
                    "next rank); is its visible part taken for that owner, and merged with "
                    "merge_partials into the running (out, lse)?"), **TOLERANCE)
            compared.append((rank, what, result, expected, mine))
    for rank, what, result, expected, mine in compared:
        for name in GRADIENTS:
            assert_close_naming(
                result[name], expected[name][:, :, mine], f"{what} {name}", rank=rank,
                against=AGAINST, mistakes={}, otherwise=(
                    "the output is right but the gradients are not: the backward recomputes "
                    "each block's probabilities from the lse the forward saved, so the merged "
                    "lse must be kept, merged at every step like out"), **TOLERANCE)


def test_ring_attention_on_two_groups_matches_one_device(impl, run_on_ranks):
    groups = [[0, 1], [2, 3]]
    check_ring(run_on_ranks(ring_on_rank, WORLD, impl, groups, timeout=TIMEOUT), groups)


def test_ring_attention_on_four_ranks_matches_one_device(impl, run_on_ranks):
    groups = [[0, 1, 2, 3]]
    check_ring(run_on_ranks(ring_on_rank, WORLD, impl, groups, timeout=TIMEOUT), groups)
