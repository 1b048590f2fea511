"""Lab 3, graded: the vocabulary-parallel cross-entropy (``vocab_parallel_cross_entropy``) against
``F.cross_entropy`` on the whole logits, on TP groups of 2 in a world of 4, every layout swept
(``reference_impl.course.sweeps``: consecutive, strided and permuted; ``--sweep-seed N`` draws
another), every group at once with logits of its own, three cases per group:

* ``padded``: a vocabulary of 13 on tp = 2, padded to 14; the padded logit holds a large value,
  which a loss that reads the unmasked logits would count;
* ``large``: logits of a few hundred (exp overflows fp32 above ~88.7), ``vocab_size`` left to
  its default;
* ``bf16``: bf16 logits (padded, as ``padded``); the loss is computed in fp32 and the gradient
  returned in bf16.

Every token's loss, the gradient of the logits under a non-uniform upstream gradient (the losses
weighted by random weights, then summed), and the communication: three all-reduces of one fp32
number per token in the forward, nothing in the backward.

Tolerance: losses atol 1e-5 (1e-3 for the large logits, whose losses are in the hundreds: fp32
keeps about 7 digits), rtol 1e-6; fp32 gradients atol 1e-6; the bf16 gradient atol = rtol = 1e-2
(bf16 keeps 8 bits of mantissa). Measured on CPU: losses within 5e-7 (the large ones exact),
fp32 gradients within 3e-7, the bf16 gradient within 4e-3.
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference_impl.checks import assert_close_naming, attempt
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.comm_contract import check_contract
from reference_impl.comm.comm_contract import expected as expected_call
from reference_impl.comm.device import current_device
from reference_impl.course.sweeps import group_layouts, group_of

pytestmark = pytest.mark.lab3

WORLD, TP, BATCH, SEQ = 4, 2, 2, 6
PAD_VALUE = 30.0  # the padded logit: large enough to change the loss if it is counted
CASES = {  # name: (vocab, scale of the logits, dtype, vocab_size argument)
    "padded": (13, 3.0, torch.float32, 13),
    "large": (16, 100.0, torch.float32, None),
    "bf16": (13, 3.0, torch.bfloat16, 13),
}

LOCAL_MAX = (
    "each rank subtracted its own (local) maximum: the maximum must be all-reduced (ReduceOp.MAX) "
    "over the group, so that every rank subtracts the same number, else the ranks' sums of exp "
    "do not add up")
NO_MAX = (
    "the losses are not finite (inf or nan) for logits of a few hundred: exp overflowed. Subtract "
    "the global maximum before exp (fp32 exp overflows above ~88)")
SUM_NOT_REDUCED = (
    "the sum of exp was not all-reduced: each rank's log-sum-exp covers only its own slice of the "
    "vocabulary")
TARGET_EVERY_RANK = (
    "the target's logit was counted on every rank: only the rank whose slice holds the target "
    "contributes it, the others contribute 0 before the all-reduce")
PADDING_COUNTED = (
    "the padded logits (past vocab_size) were counted: the loss and the softmax must use the "
    "masked logits, whose padded positions are -inf (exp gives 0)")
WRONG_SIGN = "the gradient has the wrong sign: it is softmax - one_hot, not one_hot - softmax"
ONE_HOT_EVERY_RANK = (
    "the one_hot of the target was subtracted on every rank: only the rank holding the target "
    "subtracts 1 (the others' index is a placeholder, not the target)")
NO_UPSTREAM = (
    "the gradient was not multiplied by grad_loss (the upstream gradient of each token's loss)")
MAX_NOT_ADDED_BACK = (
    "the losses are off by exactly the global maximum logit, token by token: the maximum "
    "subtracted inside exp must come off the target's logit too (l_target - max), or be added "
    "back to the log of the sum")
TARGET_REDUCED_WITH_MAX = (
    "the target's term is 0 on every token: the target's logit was all-reduced with MAX; the "
    "holder's l_target - max is <= 0 and the other ranks' 0 wins. It is a SUM: one rank "
    "contributes, the others add 0")
TARGET_OWNED_BY_NO_RANK = (
    "the tokens whose target is the first logit of a rank's slice (index start) have no target "
    "term: no rank claimed them. The rank holding a target is the one with start <= target < end")
BACKWARD_REDUCED = (
    "the backward all-reduced the gradient over the group: each rank's gradient is that of its "
    "own slice of the logits, and needs no communication")


def layouts(seed, tp=TP):
    """{layout name: groups} of TP groups of ``tp`` on WORLD ranks (``sweeps.group_layouts``)."""
    return group_layouts(WORLD, tp, seed)


def case_tensors(case, group_index, tp=TP, cases=CASES):
    """The whole (padded) logits of one TP group, in the case's dtype, its targets (the first
    and last token of the vocabulary among them) and the weights of the losses."""
    vocab, scale, dtype, _ = cases[case]
    generator = torch.Generator().manual_seed(10 * list(cases).index(case) + group_index)
    padded = -(-vocab // tp) * tp
    logits = torch.full((BATCH, SEQ, padded), PAD_VALUE)
    logits[..., :vocab] = torch.randn(BATCH, SEQ, vocab, generator=generator) * scale
    targets = torch.randint(vocab, (BATCH, SEQ), generator=generator)
    targets[0, :3] = torch.tensor([0, vocab - 1, padded // tp])  # the ends of the slices
    weights = torch.randn(BATCH, SEQ, generator=generator)
    return logits.to(dtype), targets, weights


def on_layouts(impl, function, layouts, *args):
    """``function(impl, groups, handles, *args)`` on every layout ({name: groups}), all ranks
    creating every group in the same order; {layout name: its result}."""
    found = {}
    for name, groups in layouts.items():
        handles = [dist.new_group(ranks) for ranks in groups]
        found[name] = function(impl, groups, handles, *args)
    return found


def index_of(rank, groups):
    """(the index of ``rank``'s group, its position in it)."""
    group = group_of(rank, groups)
    return groups.index(group), group.index(rank)


def vocab_parallel_losses(impl, groups, handles, backward, cases=CASES):
    """Every case on this rank's TP group: the losses, (if backward) the gradient of this rank's
    slice of the logits, and the collectives of the forward and of the backward."""
    device, rank, tp = current_device(), dist.get_rank(), len(groups[0])
    group_index, tp_rank = index_of(rank, groups)
    cross_entropy = impl.module("vocab_parallel").vocab_parallel_cross_entropy
    results = {}
    for case, (_, _, _, vocab_size) in cases.items():
        logits, targets, weights = case_tensors(case, group_index, tp, cases)
        local = logits.chunk(tp, dim=-1)[tp_rank].to(device).requires_grad_()
        with CommTracer() as forward:
            losses = cross_entropy(local, targets.to(device), handles[group_index],
                                   vocab_size=vocab_size)
        result = {"losses": losses.detach().float().cpu(),
                  "forward": (forward.summary(), forward.total_bytes(),
                              [call.as_data() for call in forward.calls])}
        if backward:
            with CommTracer() as traced:
                (losses * weights.to(device)).sum().backward()
            result.update(grad=local.grad.cpu(), backward=traced.summary())
        results[case] = result
    return results


def expected(case, group_index, tp_rank, tp=TP, cases=CASES):
    """This group's losses and this rank's gradient, from F.cross_entropy on the whole logits,
    and what the headline mistakes compute instead (each a dict {mistake: its result})."""
    vocab = cases[case][0]
    logits, targets, weights = case_tensors(case, group_index, tp, cases)
    logits = logits.float()
    width = logits.shape[-1] // tp
    mine = slice(tp_rank * width, (tp_rank + 1) * width)

    def losses_and_grad(of, weights=weights):
        """Every token's loss, and the gradient of the weighted sum, on the whole vocabulary."""
        of = of.clone().requires_grad_()
        losses = F.cross_entropy(of.flatten(0, 1), targets.flatten(), reduction="none")
        (losses.view_as(targets) * weights).sum().backward()
        return losses.detach().view_as(targets), of.grad

    whole = logits.clone()
    whole[..., vocab:] = float("-inf")  # the real vocabulary only
    losses, grad = losses_and_grad(whole)
    padding_losses, padding_grad = losses_and_grad(logits)  # the padded logit counted

    slices = whole.split(width, dim=-1)  # as the ranks hold them
    holder = targets // width  # the TP rank whose slice holds the target
    target = whole.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    top = whole.max(dim=-1).values
    local_tops = torch.stack([piece.max(dim=-1).values for piece in slices], dim=-1)
    holder_top = local_tops.gather(-1, holder.unsqueeze(-1)).squeeze(-1)
    # with the target unmasked, a rank that does not hold it reads its first logit instead
    read = sum(torch.where(holder == r, target, piece[..., 0]) for r, piece in enumerate(slices))
    log_sum = (whole - top.unsqueeze(-1)).exp().sum(-1).log()  # log S, S over every slice
    first_of_slice = targets % width == 0
    loss_mistakes = {
        MAX_NOT_ADDED_BACK: losses - top,
        TARGET_REDUCED_WITH_MAX: log_sum,
        TARGET_OWNED_BY_NO_RANK: torch.where(first_of_slice, log_sum, losses),
        LOCAL_MAX: sum((piece - local_tops[..., r:r + 1]).exp().sum(-1)
                       for r, piece in enumerate(slices)).log() - (target - holder_top),
        SUM_NOT_REDUCED: (slices[tp_rank] - top.unsqueeze(-1)).exp().sum(-1).log()
        - (target - top),
        TARGET_EVERY_RANK: (whole - top.unsqueeze(-1)).exp().sum(-1).log() - (read - tp * top),
        PADDING_COUNTED: padding_losses,
    }

    one_hot_elsewhere = torch.zeros_like(grad[..., mine])
    one_hot_elsewhere[..., 0] = torch.where(holder == tp_rank, 0.0, -weights)
    grad_mistakes = {
        WRONG_SIGN: -grad[..., mine],
        ONE_HOT_EVERY_RANK: grad[..., mine] + one_hot_elsewhere,
        NO_UPSTREAM: losses_and_grad(whole, torch.ones_like(weights))[1][..., mine],
        BACKWARD_REDUCED: sum(grad.split(width, dim=-1)),
        PADDING_COUNTED: padding_grad[..., mine],
    }
    where = {"tokens whose target is the first logit of a rank's slice": first_of_slice}
    where.update((f"tokens whose target TP rank {r} holds", holder == r) for r in range(tp))
    return losses, loss_mistakes, grad[..., mine], grad_mistakes, where


def where(rank, case, groups, layout, cases=CASES):
    vocab, scale, dtype, vocab_size = cases[case]
    return (f"rank {rank} (TP group {group_of(rank, groups)}, layout {layout}), case {case!r}: "
            f"vocabulary {vocab} on tp = {len(groups[0])}, logits of scale {scale:g} in "
            f"{str(dtype).split('.')[-1]}, vocab_size={vocab_size}")


def test_vocab_parallel_losses_with_three_all_reduces_on_every_layout(impl, run_on_ranks,
                                                                      sweep_seed):
    check_losses(run_on_ranks, impl, layouts(sweep_seed))


def check_losses(run_on_ranks, impl, layouts, cases=CASES):
    found = run_on_ranks(on_layouts, WORLD, impl, vocab_parallel_losses, layouts, False, cases)
    for layout, groups in layouts.items():
        check_losses_on(groups, layout, [f[layout] for f in found], cases)


def check_losses_on(groups, layout, results, cases):
    tp = len(groups[0])
    for rank, by_case in enumerate(results):
        for case, got in by_case.items():
            losses, mistakes, _, _, tokens = expected(case, *index_of(rank, groups), tp, cases)
            where_ = where(rank, case, groups, layout, cases)
            finite = torch.isfinite(got["losses"])
            assert finite.all(), f"{where_}: " + (
                NO_MAX if case == "large" else "the losses are not finite (inf or nan)")
            atol = 1e-3 if case == "large" else 1e-5
            assert_close_naming(
                got["losses"], losses, f"{where_}: every token's loss", atol=atol, rtol=1e-6,
                against="F.cross_entropy on the whole logits", mistakes=mistakes, where=tokens,
                otherwise=("bf16 logits: the loss differs by more than the logits' own "
                           "rounding; in what dtype is it computed?" if case == "bf16" else
                           "each token's loss is the cross entropy over the whole vocabulary, "
                           "every rank's slice of it, reduced over `group` only"))
            summary, nbytes, calls = got["forward"]
            per_token = BATCH * SEQ * 4  # one fp32 number per token
            assert summary == {"all_reduce": 3} and nbytes == 3 * per_token, (
                f"{where_}: the forward ran {summary}, {nbytes} bytes in all; it needs "
                f"exactly three all-reduces of one fp32 number per token (global max, sum of exp, "
                f"target logit): 3 x b*s*4 = {3 * per_token} bytes, never the logits")
            check_contract(calls, [expected_call("all_reduce", group_of(rank, groups), per_token)]
                           * 3, f"{where_}: the forward", rank=rank,
                           formula="three all-reduces of one fp32 number per token over the TP "
                                   "group (max, sum of exp, target logit)")


def test_vocab_parallel_gradient_without_communication_on_every_layout(impl, run_on_ranks,
                                                                      sweep_seed):
    check_gradients(run_on_ranks, impl, layouts(sweep_seed))


def check_gradients(run_on_ranks, impl, layouts, cases=CASES):
    found = run_on_ranks(on_layouts, WORLD, impl, vocab_parallel_losses, layouts, True, cases)
    for layout, groups in layouts.items():
        check_gradients_on(groups, layout, [f[layout] for f in found], cases)


def check_gradients_on(groups, layout, results, cases):
    tp = len(groups[0])
    for rank, by_case in enumerate(results):
        for case, got in by_case.items():
            _, _, grad, mistakes, _ = expected(case, *index_of(rank, groups), tp, cases)
            where_ = where(rank, case, groups, layout, cases)
            assert not got["backward"], (
                f"{where_}: the backward ran {got['backward']}; it needs no "
                f"communication (softmax - one_hot on this rank's own slice). Likely cause: "
                f"{BACKWARD_REDUCED}")
            assert torch.isfinite(got["grad"]).all(), f"{where_}: " + (
                NO_MAX if case == "large" else "the gradient is not finite (inf or nan)")
            dtype = cases[case][2]
            assert got["grad"].dtype == dtype, (
                f"{where_}: the gradient is {got['grad'].dtype}, the logits {dtype}")
            tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
            assert_close_naming(
                got["grad"].float(), grad, f"{where_}: the gradient of the logits",
                atol=tolerance, rtol=tolerance, against="F.cross_entropy's on the whole logits",
                mistakes=mistakes,
                otherwise="d loss / d logits = (softmax - one_hot(target)) * grad_loss on this "
                          "rank's slice: the softmax over the whole vocabulary (the global max and "
                          "sum), the -1 only on the rank holding the target")


# ---------------------------------------------------------------- the embedding, split by vocabulary

EMBED_VOCAB, EMBED_HIDDEN = 13, 4  # padded to 14 on tp = 2: rows [0, 7) and [7, 14)
ROWS_ELSEWHERE_READ = (
    "the tokens held by another rank were not zeroed: each rank also added the row at index 0 of "
    "its own slice for them (an index outside the slice must not be read, and its rows must not "
    "count)")
ROWS_OF_NO_RANK = (
    "exactly the tokens TP rank {rank} holds (rows {first} to {last}) are zeros after the "
    "all-reduce: no rank contributed their rows. A rank's [start, end) comes from its rank in "
    "`group` (dist.get_rank(group)), not its global rank")
WORLD_MODULO = (
    "each rank took the rows of its world rank modulo tp: that is its position in its group only "
    "when groups are consecutive ranks; in this layout two ranks claimed the same rows and some "
    "rows none (a rank's [start, end) comes from its rank in `group`)")
WORLD_RANK_RANGE = (
    "each rank took the rows of its rank in the world, not its rank in `group`: a rank whose "
    "world rank is not its position in the group looked its tokens up in another slice, or in "
    "none (a rank's [start, end) comes from dist.get_rank(group))")
EMBEDDING_NOT_REDUCED = (
    "the rows were not summed over the group: each rank returned only the rows it holds (zeros "
    "for the others); one all-reduce (reduce_from_tp) over `group` completes every token's row")


def embedding_tensors(group_index):
    """A table of 13 rows, tokens with every slice's first and last row among them, and the
    upstream gradient, for one TP group."""
    generator = torch.Generator().manual_seed(50 + group_index)
    table = torch.randn(EMBED_VOCAB, EMBED_HIDDEN, generator=generator)
    tokens = torch.randint(EMBED_VOCAB, (BATCH, SEQ), generator=generator)
    tokens[0, :4] = torch.tensor([0, 6, 7, EMBED_VOCAB - 1])
    upstream = torch.randn(BATCH, SEQ, EMBED_HIDDEN, generator=generator)
    return table, tokens, upstream


def head_tensors(group_index):
    """An LM head of 13 outputs (its weight and bias) and hidden states, for one TP group."""
    generator = torch.Generator().manual_seed(70 + group_index)
    return (torch.randn(EMBED_VOCAB, EMBED_HIDDEN, generator=generator),
            torch.randn(EMBED_VOCAB, generator=generator),
            torch.randn(BATCH, SEQ, EMBED_HIDDEN, generator=generator))


def embedding_lookups(impl, groups, handles):
    """This rank's TP group: the embedding's output, the gradient of this rank's rows, and the
    forward's collectives; the LM head's slice of the logits and its vocabulary."""
    device, rank = current_device(), dist.get_rank()
    group_index, _ = index_of(rank, groups)
    table, tokens, upstream = embedding_tensors(group_index)
    embedding = torch.nn.Embedding(EMBED_VOCAB, EMBED_HIDDEN).to(device)
    with torch.no_grad():
        embedding.weight.copy_(table)
    weight, bias, hidden = head_tensors(group_index)
    linear = torch.nn.Linear(EMBED_HIDDEN, EMBED_VOCAB).to(device)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    module = impl.module("vocab_parallel")
    parallel = module.VocabParallelEmbedding(embedding, handles[group_index])
    with CommTracer() as forward:
        output = parallel(tokens.to(device))
    output.backward(upstream.to(device))
    head = module.ParallelLMHead(linear, handles[group_index])
    half = module.ParallelLMHead(copy.deepcopy(linear).to(torch.bfloat16), handles[group_index])
    return {"output": output.detach().cpu(), "grad": parallel.weight.grad.cpu(),
            "forward": forward.summary(), "logits": head(hidden.to(device)).detach().cpu(),
            "head vocabulary": int(head.vocab_size),
            "bf16 head": {name: str(p.dtype) for name, p in half.named_parameters()},
            "bf16 logits": attempt(lambda: half(hidden.to(device, torch.bfloat16)).detach()
                                   .float().cpu())}


def test_vocab_parallel_embedding_on_every_layout(impl, run_on_ranks, sweep_seed):
    check_embedding(run_on_ranks, impl, layouts(sweep_seed))


def check_embedding(run_on_ranks, impl, layouts):
    found = run_on_ranks(on_layouts, WORLD, impl, embedding_lookups, layouts)
    for layout, groups in layouts.items():
        check_embedding_on(groups, layout, [f[layout] for f in found])


def check_embedding_on(groups, layout, results):
    TP = len(groups[0])  # noqa: N806 (the formulas below read as the module's)
    for rank, got in enumerate(results):
        group_index, tp_rank = index_of(rank, groups)
        table, tokens, upstream = embedding_tensors(group_index)
        width = -(-EMBED_VOCAB // TP)  # rows per rank
        padded = torch.cat([table, torch.zeros(width * TP - EMBED_VOCAB, EMBED_HIDDEN)])
        holder = tokens // width
        mine = holder == tp_rank
        expected = F.embedding(tokens, padded)
        firsts = padded[torch.arange(TP) * width]  # each rank's row 0
        read_elsewhere = expected + sum(torch.where((holder != r).unsqueeze(-1), firsts[r], 0.0)
                                        for r in range(TP))
        where = f"rank {rank} (TP group {group_of(rank, groups)}, layout {layout}): the " \
                f"embedding of a vocabulary of {EMBED_VOCAB} on tp = {TP} (padded to {width * TP})"
        first_rows = (tokens % width == 0).unsqueeze(-1).expand_as(expected)
        members = group_of(rank, groups)

        def claimed(believed):
            """The output when each member looks its tokens up as if it held the slice
            ``believed(member)`` (its table still its own slice)."""
            return sum(torch.where((holder == believed(m)).unsqueeze(-1),
                                   padded[(tokens + (members.index(m) - believed(m)) * width)
                                          .clamp(0, width * TP - 1)], 0.0)
                       for m in members)

        mistakes = {ROWS_ELSEWHERE_READ: read_elsewhere}
        if members != list(range(members[0], members[0] + TP)) or members[0] % TP:
            mistakes[WORLD_MODULO] = claimed(lambda m: m % TP)
        if members != list(range(TP)):
            mistakes[WORLD_RANK_RANGE] = claimed(lambda m: m)
        if got["forward"].get("all_reduce"):  # reduced: a rank's rows missing from the sum
            mistakes.update((ROWS_OF_NO_RANK.format(rank=r, first=r * width,
                                                    last=(r + 1) * width - 1),
                             expected * (holder != r).unsqueeze(-1)) for r in range(TP))
        else:
            mistakes[EMBEDDING_NOT_REDUCED] = expected * mine.unsqueeze(-1)
        assert_close_naming(
            got["output"], expected, f"{where}, its output", atol=1e-6,
            against="F.embedding on the whole table", mistakes=mistakes,
            where={"tokens whose id is the first row of a rank's slice": first_rows,
                   **{f"tokens TP rank {r} holds (rows {r * width} to {(r + 1) * width - 1})":
                      (holder == r).unsqueeze(-1).expand_as(expected) for r in range(TP)}},
            otherwise="every token's row comes from the one rank whose [start, end) holds it; "
                      "the others contribute zeros, and one all-reduce over `group` adds them")
        assert got["forward"] == {"all_reduce": 1}, (
            f"{where}: the forward ran {got['forward']}; it needs one all-reduce over `group`")
        whole_grad = torch.zeros_like(padded).index_add_(0, tokens.flatten(),
                                                         upstream.flatten(0, 1))
        assert_close_naming(
            got["grad"], whole_grad[tp_rank * width:(tp_rank + 1) * width],
            f"{where}, the gradient of this rank's rows", atol=1e-6,
            against="the rows' gradient on the whole table", mistakes={},
            otherwise="the gradient of a row is the sum of the upstream gradients of the tokens "
                      "that looked it up; a rank's rows get those of its own tokens only")
        weight, bias, hidden = head_tensors(group_index)
        padding = width * TP - EMBED_VOCAB
        logits = F.linear(hidden, torch.cat([weight, torch.zeros(padding, EMBED_HIDDEN)]),
                          torch.cat([bias, torch.zeros(padding)]))
        assert got["head vocabulary"] == EMBED_VOCAB, (
            f"{where}: ParallelLMHead.vocab_size is {got['head vocabulary']}, the real "
            f"vocabulary is {EMBED_VOCAB} (the loss ignores the logits past it)")
        assert_close_naming(
            got["logits"], logits[..., tp_rank * width:(tp_rank + 1) * width],
            f"{where}: the LM head's logits on this rank", atol=1e-5,
            against="this rank's slice of the whole head's logits, padded with zero rows",
            mistakes={}, otherwise=f"rank r holds rows [r V'/tp, (r+1) V'/tp) of the head "
                                   f"padded with zero rows to V' = {width * TP}")
        kept = {name: dtype for name, dtype in got["bf16 head"].items()
                if dtype != "torch.bfloat16"}
        assert not kept, (
            f"{where}: ParallelLMHead of a bf16 head holds {kept}: the padded layer takes the "
            "head's dtype (and device), whatever the default dtype")
        assert not isinstance(got["bf16 logits"], str), (
            f"{where}: a bf16 LM head raised {got['bf16 logits']}")
        assert_close_naming(
            got["bf16 logits"], logits[..., tp_rank * width:(tp_rank + 1) * width],
            f"{where}: a bf16 LM head's logits on this rank", atol=5e-2, rtol=2e-2,
            against="this rank's slice of the whole fp32 head's logits", mistakes={},
            otherwise="the bf16 head is the fp32 one rounded: the same rows, padded the same way")
