"""Lab 8, graded: one step of ring attention's backward alone (``ring_attention.backward_step``),
in one helper process without ranks, against autograd of single-device causal attention
computed here in float64.

At step t of the backward, rank r holds the K/V block of rank ``owner`` = r - t. Its step gives
two things: the gradient of its queries through that block's keys (dq, added to the rank's
dQ) and the gradient of the block's keys and values through its queries (dkv, this rank's
share of the block's dK/dV). Autograd gives both on one device: the loss restricted to rank
r's query rows, q's gradient taken through the owner's key columns only (the scores of the
other columns computed from a detached q), read at rank r's queries and the owner's keys. The
forward's final lse and rowsum(dO * O) of each row are handed in, from the same single-device
attention; visible_part is read from the snapshot (the reference's, recorded), so only
backward_step itself is graded.

What is swept (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws other cases, and every
failure prints its seed and case): cp = 1 to 4, every (rank, owner) pair; (batch, heads,
kv_heads) (3, 4, 2), (1, 4, 1), (2, 2, 2) (grouped-query attention: dK and dV summed over each
KV head's query heads); 1 to 3 tokens per chunk; fp32, bf16, and fp32 with scores near 95 (the
lse then near 95 to 130: probabilities exp(scores - lse) only stay finite from the saved lse).
Tolerances (atol = rtol; in brackets the largest |error| / (1 + |expected|) observed on the
reference at seed 0 and on the hidden checks' draws): fp32 1e-5 (6e-7), bf16 0.08 (0.017),
fp32 with scores near 95: 1e-3 (4.3e-5).
"""
import math
import zlib
from contextlib import contextmanager

import pytest
import torch

from reference_impl.checks import assert_close_naming
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import draw, label
from reference_impl.model import repeat_kv_heads

pytestmark = pytest.mark.lab8

HEAD_DIM = 4
SHAPES = ["3x4x2", "1x4x1", "2x2x2"]  # batch x heads x kv_heads
NUMBERS = {"fp32": (torch.float32, 1e-5), "bf16": (torch.bfloat16, 8e-2),
           "fp32, scores ~95": (torch.float32, 1e-3)}  # dtype, atol = rtol
LARGE = "fp32, scores ~95"
SPACE = {"cp": [1, 2, 3, 4], "shape": SHAPES, "chunk": [1, 2, 3], "numbers": list(NUMBERS)}
ORDER = ("dv", "dk", "dq")  # dv first: it shows a wrong lse most plainly
HINT = ("the visible part of the block (the snapshot's visible_part gave its rows, keys and mask), "
        "its gradients from the forward's lse and out_dot_grad (block_attention_backward), "
        "placed at those rows (dq) and keys (dkv) of fp32 zeros")


# ----------------------------------------------------------------- the layout and the recorded visible parts

# The snapshot's rows a helper or a rank was handed (:func:`use_recorded`): a process the
# submission runs in reads no hidden check's file, so the pytest process hands it the rows of
# the cases it runs.
_HANDED: dict = {}


def recorded(name: str, key: str):
    """Row ``key`` of the snapshot's table ``name`` ("layouts" or "visible"): the one handed to
    this process, else the snapshot's."""
    handed = _HANDED.get(name, {})
    return handed[key] if key in handed else snapshot("lab8", name)[key]


def recorded_rows(cps, chunks) -> dict:
    """The layouts' and the visible parts' rows of every (cp, chunk) of ``cps`` x ``chunks``, for
    :func:`use_recorded` in a helper or a rank."""
    keys = {f"{cp}/{chunk}" for cp in cps for chunk in chunks}
    return {name: {key: row for key, row in snapshot("lab8", name).items() if key in keys}
            for name in ("layouts", "visible")}


def use_recorded(rows: dict) -> None:
    _HANDED.clear()
    _HANDED.update(rows)


def positions_of(seq: int, cp: int, rank: int) -> list[int]:
    """The global positions of rank ``rank``'s tokens in the load-balanced layout (snapshot)."""
    return recorded("layouts", f"{cp}/{seq // (2 * cp)}")[rank].tolist()


def visible_pairs(cp: int, local: int, rank: int, owner: int) -> torch.Tensor:
    """(local, local) booleans: rank's query i sees owner's key j (key position <= query's)."""
    seq = cp * local
    queries = torch.tensor(positions_of(seq, cp, rank))
    keys = torch.tensor(positions_of(seq, cp, owner))
    return keys[None, :] <= queries[:, None]


def recorded_visible_part(cp: int, rank: int, owner: int, seq_local: int):
    """``visible_part`` as the snapshot records it: the rows, the keys and whether a mask is
    needed inside them."""
    rows0, rows1, keys0, keys1, masked = recorded(
        "visible", f"{cp}/{seq_local // 2}")[rank, owner].tolist()
    return slice(rows0, rows1), slice(keys0, keys1), bool(masked)


@contextmanager
def replaced(modules, functions: dict):
    """``functions`` in place of the modules' own, where they have them; restored after."""
    saved = [(module, name, getattr(module, name)) for module in modules for name in functions
             if hasattr(module, name)]
    for module, name, _ in saved:
        setattr(module, name, functions[name])
    try:
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


# ----------------------------------------------------------------- single-device autograd

def causal_scores(q, k, through=None):
    """q k^T / sqrt(d) of the whole sequence, -inf above the diagonal, k expanded to q's heads;
    with ``through`` (key booleans) q's gradient flows through those columns only."""
    keys = repeat_kv_heads(k, q.shape[1]).transpose(-2, -1)
    scores = q @ keys if through is None else torch.where(through, q @ keys, q.detach() @ keys)
    positions = torch.arange(q.shape[2])
    return (scores / math.sqrt(q.shape[-1])).masked_fill(positions[None, :] > positions[:, None],
                                                         float("-inf"))


def share_through(q, k, v, upstream, mine, theirs, alone: bool = False):
    """Autograd of single-device causal attention (float64) with the loss on the query rows
    ``mine`` only and q's gradient through the keys ``theirs`` only: (dq at ``mine``, dk and dv
    at ``theirs``). ``alone``: the softmax over ``theirs`` keys alone (a block's own lse)."""
    q, k, v = (t.detach().double().clone().requires_grad_() for t in (q, k, v))
    through = torch.zeros(q.shape[2], dtype=torch.bool)
    through[theirs] = True
    scores = causal_scores(q, k, through)
    if alone:
        scores = scores.masked_fill(~through, float("-inf"))
    out = scores.softmax(dim=-1).nan_to_num(0.0) @ repeat_kv_heads(v, q.shape[1])
    picked = torch.zeros(q.shape[2], 1, dtype=torch.float64)
    picked[mine] = 1.0
    (out * upstream.double() * picked).sum().backward()
    return q.grad[:, :, mine], k.grad[:, :, theirs], v.grad[:, :, theirs]


def row_statistics(q, k, v, upstream):
    """The forward's final lse of every query row and rowsum(dO * O), float64, on one device."""
    q, k, v, upstream = (t.double() for t in (q, k, v, upstream))
    scores = causal_scores(q, k)
    out = scores.softmax(dim=-1) @ repeat_kv_heads(v, q.shape[1])
    return scores.logsumexp(dim=-1), (upstream * out).sum(dim=-1)


# ----------------------------------------------------------------- the cases

def cases(seed: int, space: dict = SPACE, extra: int = 2) -> list[dict]:
    return draw(space, seed, extra=extra)


def problem(config: dict, seed: int):
    """q, k, v and the output gradient of the whole sequence in the case's dtype; at scores
    ~95, q and k share a direction that lifts every score."""
    batch, heads, kv_heads = (int(n) for n in config["shape"].split("x"))
    seq = 2 * config["cp"] * config["chunk"]
    generator = torch.Generator().manual_seed(zlib.crc32(f"backward {label(config, seed)}".encode()))
    q, k, v, upstream = (torch.randn(batch, n, seq, HEAD_DIM, generator=generator)
                         for n in (heads, kv_heads, kv_heads, heads))
    if config["numbers"] == LARGE:
        lift = math.sqrt(95 / math.sqrt(HEAD_DIM))
        q, k = q + lift, k + lift
    dtype = NUMBERS[config["numbers"]][0]
    return [t.to(dtype) for t in (q, k, v, upstream)]


def pairs(config: dict):
    return [(rank, owner) for rank in range(config["cp"]) for owner in range(config["cp"])]


def steps_alone(impl, configs: list[dict], seed: int, rows: dict) -> dict:
    """{case label: {"rank/owner": (dq, dkv) or an error as text}}: the submission's
    backward_step with the test's visible_part (the snapshot's ``rows``)."""
    use_recorded(rows)
    ring = impl.module("ring_attention")
    found = {}
    with replaced([ring], {"visible_part": recorded_visible_part}):
        for config in configs:
            cp = config["cp"]
            q, k, v, upstream = problem(config, seed)
            lse, out_dot_grad = (t.float() for t in row_statistics(q, k, v, upstream))
            results = found[label(config, seed)] = {}
            for rank, owner in pairs(config):
                mine, theirs = positions_of(q.shape[2], cp, rank), positions_of(q.shape[2], cp, owner)
                arguments = (q[:, :, mine], torch.stack((k[:, :, theirs], v[:, :, theirs])),
                             upstream[:, :, mine], lse[:, :, mine], out_dot_grad[:, :, mine],
                             torch.tensor(mine), cp, rank, owner)
                try:
                    grad_q, grad_kv = ring.backward_step(*arguments)
                    results[f"{rank}/{owner}"] = (grad_q.detach().clone(), grad_kv.detach().clone())
                except Exception as error:  # named in the test, with the case
                    results[f"{rank}/{owner}"] = f"{type(error).__name__}: {error}"
    return found


# ----------------------------------------------------------------- the checks

def check_pair(config: dict, seed: int, rank: int, owner: int, result) -> None:
    """One (rank, owner) step of a case: raised, shapes, then dv, dk, dq against autograd."""
    cp = config["cp"]
    what = f"backward_step(cp={cp}, rank={rank}, owner={owner}) [{label(config, seed)}]"
    assert not isinstance(result, str), f"{what} raised {result}"
    q, k, v, upstream = problem(config, seed)
    mine, theirs = positions_of(q.shape[2], cp, rank), positions_of(q.shape[2], cp, owner)
    grad_q, grad_kv = result
    wanted_q, wanted_kv = tuple(q[:, :, mine].shape), (2, *k[:, :, theirs].shape)
    assert tuple(grad_q.shape) == wanted_q and tuple(grad_kv.shape) == wanted_kv, (
        f"{what} gave dq {tuple(grad_q.shape)} and dkv {tuple(grad_kv.shape)}: expected dq like "
        f"this rank's q {wanted_q} and dkv like the block's stacked (k, v) {wanted_kv}, whole, "
        "zero where the queries see nothing of the block")
    dtypes = {str(grad_q.dtype), str(grad_kv.dtype)}
    assert dtypes == {"torch.float32"}, (
        f"{what} gave dq and dkv in {sorted(dtypes)}: a block's shares are summed over every "
        "step of the ring, so they are made and returned in fp32, whatever the inputs' dtype "
        "(summed in bf16 they lose the small shares)")
    expected = dict(zip(("dq", "dk", "dv"), share_through(q, k, v, upstream, mine, theirs)))
    wrong_lse = dict(zip(("dq", "dk", "dv"), share_through(q, k, v, upstream, mine, theirs, alone=True)))
    actual = {"dq": grad_q, "dk": grad_kv[0], "dv": grad_kv[1]}
    tolerance = NUMBERS[config["numbers"]][1]
    for name in ORDER:
        mistakes = {} if owner == rank and cp == 1 else {
            "the block's probabilities were normalised over its own keys (its own lse, "
            "recomputed), not by the forward's lse over every block: a block holds only its share "
            "of each row's softmax, exp(scores - lse) with the lse the forward saved": wrong_lse[name]}
        assert_close_naming(actual[name].double(), expected[name], f"{what}'s {name}",
                            mistakes=mistakes, otherwise=HINT, atol=tolerance, rtol=tolerance,
                            against="autograd of single-device causal attention (float64)")


def check_backward_steps(impl, run_alone, configs: list[dict], seed: int) -> None:
    rows = recorded_rows({c["cp"] for c in configs}, {c["chunk"] for c in configs})
    found = run_alone(steps_alone, impl, configs, seed, rows)
    failure = ""
    for config in configs:
        for rank, owner in pairs(config):
            try:
                check_pair(config, seed, rank, owner, found[label(config, seed)][f"{rank}/{owner}"])
            except AssertionError as error:  # the message says it all
                failure = str(error).split("\nassert ")[0]
                break
        if failure:
            break
    if failure:
        pytest.fail(failure, pytrace=False)


def test_backward_step_alone_matches_autograd(impl, run_alone, sweep_seed):
    check_backward_steps(impl, run_alone, cases(sweep_seed), sweep_seed)
