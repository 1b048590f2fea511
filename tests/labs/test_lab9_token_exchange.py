"""Lab 9, graded: the all-to-all of rows and its backward (``token_exchange.py``), alone on 4
ranks, before the layer that runs it (``test_lab9_moe.py``).

Seen from the whole group, an all-to-all moves rows without changing them: it is one
permutation of every rank's rows (``stored``: for each rank, which rows of all the ranks'
rows, concatenated in rank order, it receives; the reference's, from the snapshot). Its
backward is then the permutation's gradient, which autograd gives on one device here: the
submission's ``all_to_all_rows`` on the ranks must give the same rows forward and the same
gradient backward, bit for bit (a permutation adds nothing up, in any dtype).

Swept with ``reference_impl.course.sweeps`` from ``--sweep-seed``: the world and groups of 2
(consecutive, strided, permuted); fp32, bf16 and fp64 rows of shape (hidden,) and (2, 3);
uneven splits, splits of zero rows, and a rank that sends nothing; and, paired with those cases
so that each appears at every seed, the memory layout of what the exchange is handed: contiguous
rows, rows given as a transposed view (not contiguous), and a loss (the sum of the received
rows, weighted per column) whose gradient reaches the backward expanded (stride 0 along the
rows), as ``out.sum()``'s does. Checked per rank: the rows
received, the gradient of the rows sent, the ``AllToAllCall`` records (forward and backward,
the backward's splits the forward's swapped) and the traced communication: one
``all_to_all_single`` over the group forward, one backward whose payload is the rows the
forward received. Split sizes that disagree are refused by name on every rank (no hang).
"""
import random

import pytest
import torch
import torch.distributed as dist

from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.device import current_device
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import draw, group_layouts, label
from test_lab9_moe import SplitSizesDisagree, blame, calls_between, made_groups, seeded, traced

pytestmark = pytest.mark.lab9

WORLD, HIDDEN, TIMEOUT, NAME = 4, 8, 180, "exchange"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
EXCHANGE_SPACE = {"layout": ["world", "consecutive", "strided", "permuted"],
                  "dtype": ["fp32", "bf16", "fp64"], "row": [(HIDDEN,), (2, 3)],
                  "splits": ["uneven", "zeros", "a rank sends nothing"]}
MEMORY = ["contiguous", "a transposed view", "an expanded gradient"]  # how the rows are handed
NOT_CONTIGUOUS = {
    "a transposed view": "the rows were handed as a transposed view (not contiguous)",
    "an expanded gradient": "the loss sums the received rows, so the gradient reaches the "
                            "backward expanded (stride 0 along the rows, not contiguous)"}


def exchange_configs(seed):
    return draw(EXCHANGE_SPACE, seed, extra=2)


def exchange_memory(count, seed):
    """The memory layout of each of ``count`` cases: every one of MEMORY, in a seeded order
    (apart from the drawn configurations, whose split sizes the snapshot holds)."""
    memory = [MEMORY[i % len(MEMORY)] for i in range(count)]
    random.Random(f"memory {seed}").shuffle(memory)
    return memory


def exchange_label(config, memory, seed):
    return label({**config, "memory": memory}, seed)


def exchange_groups(config, seed):
    if config["layout"] == "world":
        return [list(range(WORLD))]
    return group_layouts(WORLD, 2, seed)[config["layout"]]


def exchange_sends(config, seed):
    """Per rank, the rows it sends to each rank of its group (in the group's order)."""
    groups = exchange_groups(config, seed)
    rng = random.Random(f"{seed} {config}")
    sends = []
    for rank in range(WORLD):
        size = len(next(g for g in groups if rank in g))
        counts = [rng.randint(1, 5) for _ in range(size)]
        if config["splits"] == "zeros":
            counts[rank % size] = 0
        if config["splits"] == "a rank sends nothing" and rank == 1:
            counts = [0] * size
        sends.append(counts)
    return sends


def exchange_rows(config, seed, index, rank, count, memory="contiguous"):
    """Rank ``rank``'s ``count`` rows, and a gradient for ``count`` received rows: at
    "an expanded gradient", one row's gradient for every row (the loss weighs each column of
    the received rows' sum), expanded."""
    dtype, base = DTYPES[config["dtype"]], 7919 * seed + 1000 * index + 10 * rank
    shape = (count, *config["row"])
    if memory == "an expanded gradient":
        return seeded(shape, base + 1).to(dtype), seeded(config["row"], base + 2).to(dtype).expand(shape)
    return seeded(shape, base + 1).to(dtype), seeded(shape, base + 2).to(dtype)


def handed_rows(rows, memory):
    """(the leaf whose gradient is checked, the rows handed to the exchange: the same values,
    a transposed view of the leaf at "a transposed view"); the leaf's gradient as rows is
    :func:`rows_gradient`."""
    if memory != "a transposed view":
        leaf = rows.clone().requires_grad_()
        return leaf, leaf
    leaf = rows.movedim(0, -1).contiguous().requires_grad_()  # rows along the last dimension
    return leaf, leaf.movedim(-1, 0)


def rows_gradient(leaf, memory):
    if leaf.grad is None or memory != "a transposed view":
        return leaf.grad
    return leaf.grad.movedim(-1, 0)


def loss_of(received, upstream, memory):
    """The loss whose gradient for the received rows is ``upstream``: at "an expanded
    gradient" the received rows' sum weighted per column, so that autograd hands the exchange's
    backward an expanded (stride 0) gradient."""
    if memory == "an expanded gradient":
        return (received.sum(dim=0) * upstream[0]).sum() if len(upstream) else received.sum() * 0
    return (received * upstream).sum()


def stored(seed):
    try:
        return snapshot("lab9", f"exchange seed {seed}")
    except KeyError:
        raise AssertionError(f"lab 9's expected values are stored for the graded seeds only, "
                             f"not for --sweep-seed {seed}: run without --sweep-seed") from None


def stopped(error, all_reduce) -> bool:
    """Whether any rank has an error (a collective over the world: every rank calls it at the
    same point, so a rank that failed early never leaves the others waiting in an exchange)."""
    flag = torch.tensor([error is not None])
    all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag)


class NotContiguous(RuntimeError):
    """A tensor that is not contiguous handed to all_to_all_single on some rank, refused on
    every rank at once."""


def refuse_not_contiguous(all_reduce):
    """Wrap ``dist.all_to_all_single`` (above the tracer's wrapper of :func:`traced`): a tensor
    that is not contiguous on any rank is refused on every rank at once, with its strides
    (gloo refuses it with "Tensors must be contiguous" on that rank alone, and its peers would
    wait in the exchange). ``all_reduce``: untraced, over the world (every rank reaches each
    all-to-all together, as :func:`traced` assumes). Returns the function that undoes it."""
    inner = dist.all_to_all_single

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                          group=None, async_op=False):
        mine = [f"its {name} {tuple(t.shape)} has strides {t.stride()}"
                for name, t in (("input", input), ("output", output)) if not t.is_contiguous()]
        unlike = ([f"its output {tuple(output.shape)} {output.dtype} and input "
                   f"{tuple(input.shape)} {input.dtype} differ beyond the number of rows"]
                  if output.shape[1:] != input.shape[1:] or output.dtype != input.dtype else [])
        flags = torch.zeros(dist.get_world_size(), dtype=torch.long, device=current_device())
        flags[dist.get_rank()] = len(mine) + 10 * len(unlike)
        all_reduce(flags)  # which ranks were handed one
        if (flags >= 10).any():
            ranks = (flags >= 10).nonzero().flatten().tolist()
            raise ValueError(
                f"all_to_all_single on rank {dist.get_rank()}: "
                + ("; ".join(unlike) if unlike else f"the tensors of rank(s) {ranks} differ")
                + ". Likely cause: the output buffer made with another row shape or dtype than "
                "the rows sent: every row keeps its shape and dtype, only how many there are "
                "changes (gloo would wait for bytes that never come)")
        if flags.any():
            ranks = flags.nonzero().flatten().tolist()
            raise NotContiguous(
                f"all_to_all_single on rank {dist.get_rank()}: "
                + ("; ".join(mine) if mine else f"the tensors of rank(s) {ranks}")
                + ", not contiguous: gloo and NCCL refuse it ('Tensors must be contiguous')")
        return inner(output, input, output_split_sizes, input_split_sizes, group, async_op)

    dist.all_to_all_single = all_to_all_single

    def undo():
        dist.all_to_all_single = inner

    return undo


def exchange_on_rank(impl, configs, seed, receives):
    """Each configuration's forward and backward on this rank, as data; the first error
    (on any rank) stops every rank after that configuration."""
    rank, real_all_reduce = dist.get_rank(), dist.all_reduce
    layouts = {}
    for config in configs:  # every rank makes every group, in the same order
        if config["layout"] not in layouts:
            layouts[config["layout"]] = made_groups({"G": exchange_groups(config, seed)})["G"]
    exchanges, phase, results = [], ["forward"], []
    tracer, undo = traced(exchanges, phase)
    undo_refusal = refuse_not_contiguous(real_all_reduce)
    try:
        token_exchange = impl.module("token_exchange")
        for index, (config, memory) in enumerate(zip(configs, exchange_memory(len(configs), seed))):
            group, members = layouts[config["layout"]]
            sends = exchange_sends(config, seed)[rank]
            leaf, rows = handed_rows(exchange_rows(config, seed, index, rank, sum(sends))[0], memory)
            _, upstream = exchange_rows(config, seed, index, rank, sum(receives[index][rank]), memory)
            log, error, marks, received, halted = [], None, [len(tracer.calls)], None, False
            exchanges.clear()
            for step in ("forward", "backward"):
                phase[0] = step
                try:
                    if step == "forward":
                        received = token_exchange.all_to_all_rows(
                            rows, sends, receives[index][rank], group, NAME, log)
                        loss = loss_of(received, upstream, memory)
                    else:
                        loss.backward()
                    marks.append(len(tracer.calls))
                except Exception as caught:  # SplitSizesDisagree: on every rank at once
                    error = {"error": f"{type(caught).__name__}: {caught}", "phase": step,
                             "refused": isinstance(caught, SplitSizesDisagree),
                             "exchanges": [{k: v for k, v in e.items()
                                            if k in ("sends", "receives")} for e in exchanges]}
                halted = stopped(error, real_all_reduce)  # every rank, after each direction
                if halted:
                    break
            results.append({
                "members": members, "sends": sends, "error": error,
                "received": None if received is None else received.detach(),
                "grad": rows_gradient(leaf, memory),
                "log": [(c.name, list(c.send_splits), list(c.recv_splits))
                        for c in log if hasattr(c, "name")],
                "calls": [calls_between(tracer, start, end)
                          for start, end in zip(marks, marks[1:])]})
            if halted:
                break
    finally:
        undo_refusal()
        undo()
    return results


def truth(config, seed, index, wanted, memory):
    """What every rank receives and the gradient of what it sent, on one device: the
    all-to-all as indexing into every rank's rows (``wanted[r]["index"]``), its gradient by
    autograd."""
    counts = [sum(s) for s in exchange_sends(config, seed)]
    every = torch.cat([exchange_rows(config, seed, index, r, counts[r])[0]
                       for r in range(WORLD)]).requires_grad_()
    received = [every[wanted[r]["index"]] for r in range(WORLD)]
    upstream = [exchange_rows(config, seed, index, r, len(received[r]), memory)[1]
                for r in range(WORLD)]
    sum((got * g).sum() for got, g in zip(received, upstream)).backward()
    return [x.detach() for x in received], list(every.grad.split(counts)), upstream


def error_problem(error, forward, memory="contiguous"):
    """What an error raised on a rank says about the submission."""
    text = error["error"]
    if "contiguous" in text:
        given = f": {NOT_CONTIGUOUS[memory]}" if memory in NOT_CONTIGUOUS else ""
        return (f"all_to_all_rows raised in the {error['phase']} ({text}){given}. Likely "
                "cause: a tensor that is not contiguous was "
                "handed to all_to_all_single, which reads (and gloo and NCCL accept) contiguous "
                "tensors only: make what is exchanged contiguous first (.contiguous(), a no-op "
                "on a tensor that already is), in the forward (rows may be any view) and in the "
                "backward (autograd may hand it an expanded gradient)")
    if error["phase"] == "backward":
        failed = error["exchanges"][-1] if len(error["exchanges"]) > 1 else None
        if failed and (failed["sends"], failed["receives"]) == (forward["sends"],
                                                                forward["receives"]):
            return (f"the backward exchanged with the forward's split sizes (input "
                    f"{failed['sends']}, output {failed['receives']}): the gradient of a row "
                    "goes back to the rank it came from, so the backward's input splits are "
                    f"the forward's output splits and the other way ({text})")
        if "invalid gradient" in text:
            return ("the backward returned the gradient of the received rows without "
                    "exchanging it: it has the received rows' shape, and the rows' gradient "
                    f"must have the shape of the rows this rank sent ({text})")
        return f"the backward of all_to_all_rows raised {text}"
    if error["refused"] and "its tensors have" in text:
        return ("the rows tensors do not match the split sizes: the output holds the rows this "
                "rank receives (the sum of its output splits), the input the rows it sends "
                f"({text})")
    return f"all_to_all_rows raised in the forward: {text}"


def rank_problem(found, want, wanted, upstream, memory="contiguous"):
    """The first thing wrong with one rank's exchange, named; None when right."""
    received, sends, receives = found["received"], found["sends"], wanted["receives"]
    if found["error"]:
        return error_problem(found["error"], {"sends": sends, "receives": receives}, memory)
    if received is None or received.shape != want[0].shape or received.dtype != want[0].dtype:
        shape = None if received is None else (tuple(received.shape), received.dtype)
        return (f"the forward returned {shape}, the rows received are "
                f"{(tuple(want[0].shape), want[0].dtype)}: {receives} rows from the ranks of "
                "the group, in rank order, each row keeping its shape and dtype")
    if not torch.equal(received, want[0]):
        return ("the forward received other rows than the ranks sent it: rank s's rows for "
                "this rank, in rank order")
    grad = found["grad"]
    if grad is None:
        return ("the rows sent got no gradient: all_to_all_rows must stay differentiable (an "
                "autograd Function whose backward returns the rows' gradient first)")
    if grad.shape == upstream.shape and torch.equal(grad, upstream) and sends != receives:
        return ("the backward returned the gradient of the received rows without "
                "exchanging it")
    if grad.shape != want[1].shape or not torch.equal(grad, want[1]):
        wrong = "" if grad.shape != want[1].shape else (
            f" ({int((grad != want[1]).any(dim=-1).flatten().sum())} rows differ)")
        return (f"the gradient of the rows sent differs from the gradient of the same "
                f"permutation on one device{wrong}: see the notebook's derivation of the "
                "all-to-all's backward")
    return None


def log_problem(found, receives):
    """The AllToAllCall records: forward, then backward with the splits swapped."""
    right = [(f"{NAME} forward", found["sends"], receives),
             (f"{NAME} backward", receives, found["sends"])]
    if found["log"] != right:
        return (f"the log holds {found['log']} (name, send splits, receive splits), not "
                f"{right}: each direction is logged once, the backward sending what the "
                "forward received")
    return None


def contract(found, receives, config, rank, what):
    """One all_to_all_single over the group each way: the forward's payload is the rows this
    rank sends, the backward's the rows it received (the forward's, splits swapped)."""
    row_bytes = torch.empty(config["row"], dtype=DTYPES[config["dtype"]]).nbytes
    for direction, calls, rows in (("forward", found["calls"][0], sum(found["sends"])),
                                   ("backward", found["calls"][1], sum(receives))):
        check_contract(calls, [expected("all_to_all_single", found["members"],
                                        rows * row_bytes)],
                       f"{what}: the {direction}", rank=rank, formula="the forward sends "
                       "its rows, the backward the gradient of the rows it received, over the "
                       "same group")


def check_exchange(impl, run_on_ranks, seed):
    configs, wanted = exchange_configs(seed), stored(seed)
    receives = [[each["receives"] for each in ranks] for ranks in wanted]
    results = run_on_ranks(exchange_on_rank, WORLD, impl, configs, seed, receives,
                           timeout=TIMEOUT)
    empty = 0
    for index, (config, memory) in enumerate(zip(configs, exchange_memory(len(configs), seed))):
        want = truth(config, seed, index, wanted[index], memory)
        what = f"all_to_all_rows ({exchange_label(config, memory, seed)})"
        for rank in range(WORLD):
            found = results[rank][index]
            blame(rank_problem(found, (want[0][rank], want[1][rank]), wanted[index][rank],
                               want[2][rank], memory), f"{what} on rank {rank}")
        for rank in range(WORLD):
            found = results[rank][index]
            blame(log_problem(found, wanted[index][rank]["receives"]), f"{what} on rank {rank}")
            contract(found, wanted[index][rank]["receives"], config, rank, what)
            empty += found["sends"].count(0)
    assert empty > 0, f"seed {seed}: no split was empty (a weak sweep)"


def test_all_to_all_alone(impl, run_on_ranks, sweep_seed):
    check_exchange(impl, run_on_ranks, sweep_seed)
