"""Lab 9, graded: the top-k router (``router.py``) and the expert-parallel MoE layer
(``expert_parallel.py``: dispatch, combine, gradient sync), each unit alone before the layer.
The all-to-all's backward (``token_exchange.py``) has its own file,
``test_lab9_token_exchange.py``.

The expected values are the reference's, stored when the kit is built (the snapshot
``tests/labs/snapshots/lab9.pt``, read with ``reference_impl.course.snapshots.snapshot``):
this file checks a submission against them and against invariants that any right answer
keeps (the probabilities of a token add up to 1, an expert keeps no more than its capacity
and keeps the first of its assignments, a token's weights add up to 1 when renormalised), and
names a mistake from what it breaks. It does not route tokens itself.

Every configuration is drawn with ``reference_impl.course.sweeps`` from the seed of
``--sweep-seed`` (default 0; the snapshot holds the seeds the graded runs use), and every
failure names it (``seed S: ...``).

* **The router alone** (one helper process): E = 4, 8; k = 1, 2; capacity factors 0.5, 1.0,
  1.25 and dropless; renormalised or raw weights; the gate in fp32 and bf16; logits of
  magnitude ~1 and ~100 (past exp's fp32 range); 13, 64 and 509 tokens (less those
  whose k-th and (k+1)-th logits tie); an expert that no token picks. Checked: the
  fp32 probabilities, the experts chosen, the weights, what was kept, the counts, the aux
  loss, the capacity, the gate's gradient; the refusal of k > E.
* **The gradient sync alone** (4 ranks): ``sync_moe_grads`` on known gradients, the groups
  made here from the stored layout (not by ``create_expert_groups``), for every layout below;
  each rank's all-reduces checked against the formula: one over its DP group (the dense
  bytes), one over its EDP group (its experts' bytes), none over a group of one rank. A wrong
  value is named by the one known mistake that explains every gradient of the sweep.
* **The layer** (4 ranks, one launch shared by the dispatch, combine and layer tests): data
  parallelism over the world (dp 4, ep 1, 2, 4) or over two groups of 2 (consecutive,
  strided, permuted; ep 2, and ep 1), E = 4, 8, k = 1, 2, dropping or dropless, uneven
  token counts per rank (one rank with a single token), an expert no token picks (zero
  splits), two SGD steps with every gradient read after each. Checked in order, each failure
  blamed on its function: the groups, the routing (router.py), the dispatch (the rows each
  rank sends, in expert order, and its split sizes), the combine (splits reversed, rows
  weighted and put back in their tokens' places), then the composition: outputs, aux loss,
  input gradients (through the all-to-all's backward), gradients before the sync (the
  router's: the rank's own loss; an expert's: its EP group's losses), after it (the mean over
  the DP group's losses), the weights after each step. The all-to-alls, forward and backward,
  are checked per rank with the bytes of ``moe_costs.all_to_all_bytes`` (a traced payload is
  the whole input: those bytes plus the rows a rank keeps).

Before the submission is loaded, each rank traces its collectives (``CommTracer``) and checks
every ``all_to_all_single``'s split sizes with its peers first, refusing by name splits that
disagree rather than leaving them to hang.

Tolerances: fp32 1e-5 absolute and relative (observed about 2e-7: the same products summed in
another order); the rows a dispatch sends are copies, compared exactly; in bf16 the weights
1e-2 (one bf16 step near 1 is 4e-3) and the gate's gradient 2e-2 of its largest entry; the
experts chosen and the drops are compared exactly (the stored configurations have no ties).
"""
import inspect
import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference_impl.checks import assert_close
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import draw, group_layouts, label
from reference_impl.moe.moe_costs import all_to_all_bytes

pytestmark = pytest.mark.lab9

HIDDEN, FFN, AUX, LR, STEPS, WORLD = 8, 16, 0.1, 0.1, 2, 4
TOLERANCE = dict(atol=1e-5, rtol=1e-5)
MATCH = dict(atol=1e-6, rtol=1e-5)  # a result "is" a known mistake's
TIMEOUT = 180
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ROW_BYTES = HIDDEN * 4


# ----------------------------------------------------------------- data, seeded

def seeded(shape, seed, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def tokens(count, seed):
    """(count, HIDDEN) tokens whose feature 0 is 1: a gate row with a large negative weight
    there makes an expert no token picks."""
    x = seeded((count, HIDDEN), seed)
    x[:, 0] = 1.0
    return x


def gate_weight(experts, seed, scale=1.0, empty=False):
    weight = seeded((experts, HIDDEN), seed, 0.5 * scale)
    if empty:
        weight[experts - 1, 0] = -100.0 * scale
    return weight


def layer_parameters(config, seed):
    """name -> value of a MoE layer's parameters (the names of ``moe_layer.MoELayer``)."""
    experts = config["experts"]
    found = {"router.gate.weight": gate_weight(experts, seed, empty=config["empty expert"])}
    for e in range(experts):
        for layer, shape in (("fc1", (FFN, HIDDEN)), ("fc2", (HIDDEN, FFN))):
            found[f"experts.{e}.{layer}.weight"] = seeded(shape, seed + 10 * e + 1, 0.3)
            found[f"experts.{e}.{layer}.bias"] = seeded(shape[:1], seed + 10 * e + 2, 0.1)
    return found


def config_seed(seed, index):
    return 7919 * seed + 1000 * index


# ----------------------------------------------------------------- the stored values

def stored(part, seed):
    """The reference's values of ``part`` ("router", "layouts", "sync", "layer") for the
    sweep of ``seed``."""
    try:
        return snapshot("lab9", f"{part} seed {seed}")
    except KeyError:
        raise AssertionError(f"lab 9's expected values are stored for the graded seeds only, "
                             f"not for --sweep-seed {seed}: run without --sweep-seed") from None


# ----------------------------------------------------------------- the routing's verdicts

def bf16_exact(values):
    """Whether every value is a bf16 number (what a softmax taken in bf16 gives, cast up)."""
    return torch.equal(values, values.to(torch.bfloat16).float())


def probabilities_problem(found, want):
    """What is wrong with a router's probabilities (T, E), named, or None."""
    actual, right = found["probabilities"], want["probabilities"]
    if tuple(actual.shape) != tuple(right.shape):
        return (f"the router's probabilities have shape {tuple(actual.shape)}, not (T, E) = "
                f"{tuple(right.shape)}: one softmax over the E experts per token")
    if actual.dtype != torch.float32:
        return (f"the router's probabilities are in {actual.dtype}: the softmax is taken in "
                "fp32 (cast the gate's logits with .float() first)")
    if not torch.isfinite(actual).all():
        return ("the router's probabilities are not finite: exp of large logits overflowed "
                "(torch.softmax subtracts the largest logit first; a hand-written softmax must "
                "too)")
    if torch.allclose(actual, right, **TOLERANCE):
        return None
    ones = torch.ones(1, dtype=torch.float64)
    by_token, by_expert = actual.double().sum(dim=1), actual.double().sum(dim=0)
    if not torch.allclose(by_token, ones, atol=1e-4) and len(actual) > 1 and torch.allclose(
            by_expert, ones, atol=1e-4):
        return ("the router's softmax is over the wrong dimension (over the tokens, dim 0): each "
                "token's probabilities are a softmax over its E experts (dim -1), so each row "
                "adds up to 1; here each column does")
    if bf16_exact(actual) and not bf16_exact(right):
        return ("the router's softmax was taken in the gate's dtype (bf16), then cast: every "
                "probability is a bf16 number; take it in fp32 (.float() before the softmax)")
    error = float((actual - right).abs().max())
    return (f"the router's probabilities differ by up to {error:.3g} from softmax(x W_gate^T) "
            "over the experts, in fp32")


def experts_problem(found, want, top_k):
    index, right = found["expert_index"], want["expert_index"]
    if index.dtype != torch.long or tuple(index.shape) != tuple(right.shape):
        return (f"expert_index is {index.dtype} of shape {tuple(index.shape)}, not long (T, k) "
                f"= {tuple(right.shape)}")
    if torch.equal(index, right):
        return None
    wrong = int((index != right).any(1).sum())
    probabilities = want["probabilities"]
    if int(index.min()) >= 0 and int(index.max()) < probabilities.shape[1] and torch.equal(
            probabilities.gather(1, index), probabilities.topk(top_k, dim=-1).values):
        return (f"the experts chosen differ on {wrong} of {len(right)} tokens whose "
                "probabilities tie (equal, or both 0 after underflow): the graded values "
                "break ties as torch.topk does")
    if torch.equal(index.sort(dim=1).values, right.sort(dim=1).values):
        return (f"the experts chosen are right but in another order for {wrong} of "
                f"{len(right)} tokens: slot 0 is the most probable expert, then slot 1, ...")
    return (f"the experts chosen ({wrong} of {len(right)} tokens differ) are not each token's "
            f"k = {top_k} most probable experts, most probable first")


def weight_problem(found, want, renormalize):
    """Why the weights differ, named where an invariant they break says it."""
    weight, right = found["weight"].double(), want["weight"].double()
    bf16 = found["weight"].dtype == torch.bfloat16
    if tuple(weight.shape) != tuple(right.shape):
        return f"the weights have shape {tuple(weight.shape)}, not (T, k) = {tuple(right.shape)}"
    if torch.allclose(weight, right, **(dict(atol=1e-2, rtol=0) if bf16 else TOLERANCE)):
        return None
    add_up = torch.allclose(weight.sum(dim=1), torch.ones(1, dtype=torch.float64),
                            atol=2e-2 if bf16 else 1e-5)
    if renormalize and not add_up:
        return ("the weights were not renormalised over the k chosen experts (renormalize="
                "True: p / sum of the k p's, so a token's weights add up to 1)")
    if not renormalize and add_up:
        return ("the weights add up to 1 although renormalize=False: the softmax was taken "
                "over the top-k only, or the weights renormalised (the probabilities are a "
                "softmax over all E experts, then the k largest are taken, and with "
                "renormalize=False those are the weights)")
    return ("the weights are not the chosen experts' probabilities (renormalised over the k "
            "when renormalize=True): see router.py's docstring")


def queues_in_order(kept, index, experts):
    """Whether, walking the assignments in the order given (``kept`` and ``index`` flat), every
    expert keeps a prefix of its queue: nothing kept after something dropped."""
    for e in range(experts):
        mine = kept[index == e]
        if (mine[1:] & ~mine[:-1]).any():
            return False
    return True


def kept_problem(found, want, experts):
    """Why the drops differ: the invariants a capacity queue in token order keeps."""
    kept, index, capacity = found["kept"], found["expert_index"], want["capacity"]
    counts = torch.bincount(index[kept], minlength=experts)
    routed = torch.bincount(index.flatten(), minlength=experts)
    if capacity is not None and (counts > capacity).any():
        return (f"tokens past capacity were kept: an expert kept {int(counts.max())} "
                f"assignments, its capacity is {capacity}")
    room = routed if capacity is None else routed.clamp(max=capacity)
    if (counts < room).any():
        e = int((counts < room).nonzero()[0])
        return (f"expert {e} dropped assignments while it had room: it kept {int(counts[e])} "
                f"of its {int(routed[e])}, its capacity is {capacity} (dropless when None)")
    if queues_in_order(kept.flatten(), index.flatten(), experts):
        return None
    if index.shape[1] > 1 and queues_in_order(kept.t().flatten(), index.t().flatten(), experts):
        return ("the capacity queue counted slot by slot (every token's first choice before "
                "any second choice): an expert's assignments queue in token order, a token's "
                "slots together")
    if queues_in_order(kept.flip(0).flatten(), index.flip(0).flatten(), experts):
        return "the last assignments were kept instead of the first, in token order"
    return (f"each expert keeps the first capacity = ceil(factor T k / E) = {capacity} of its "
            "assignments, counted in token order")


def routing_problem(found, want, config):
    """The first thing wrong with one router call's result (as data), named; None when it is
    the reference's. Compares exactly what must be exact, within tolerance what is computed."""
    experts = want["probabilities"].shape[1]
    cause = probabilities_problem(found, want) or experts_problem(found, want, config["top_k"])
    if cause:
        return cause
    cause = weight_problem(found, want, config["renormalize"])
    if cause:
        return f"the routing weights differ: {cause}"
    if not torch.equal(found["kept"], want["kept"]):
        wrong = int((found["kept"] != want["kept"]).sum())
        cause = kept_problem(found, want, experts) or "see router.py's capacity rule"
        return f"{wrong} of {want['kept'].numel()} assignments kept or dropped wrongly: {cause}"
    counts, right = found["tokens_per_expert"].tolist(), want["tokens_per_expert"].tolist()
    if counts != right:
        every = torch.bincount(found["expert_index"].flatten(), minlength=experts).tolist()
        why = " (it counts the dropped assignments too)" if counts == every else ""
        return f"tokens_per_expert is {counts}, the kept assignments per expert are {right}{why}"
    if not torch.allclose(found["aux_loss"].double(), want["aux_loss"].double(), **TOLERANCE):
        return (f"the Switch aux loss is {float(found['aux_loss']):.6g}, the reference's "
                f"{float(want['aux_loss']):.6g}: E sum_e f_e P_e, f_e over every assignment "
                "before dropping, P_e the mean probability over all tokens")
    return None


# ----------------------------------------------------------------- the router alone

ROUTER_SPACE = {"experts": [4, 8], "top_k": [1, 2], "capacity": [None, 0.5, 1.0, 1.25],
                "renormalize": [True, False], "dtype": ["fp32", "bf16"], "logits": ["~1", "~100"],
                "tokens": [13, 64, 509], "empty expert": [False, True]}
LARGE_SPREAD, LARGE_OFFSET = 20.0, 100.0  # "~100": 100 +- ~7, past exp's fp32 range (88.7)
TIE_GAP = 1e-3  # top-(k+1) logits closer than this: the token's experts would be a coin toss


def router_configs(seed):
    return draw(ROUTER_SPACE, seed, extra=4)


def router_inputs(config, seed):
    """Tokens, the gate's weight and a gradient for the weights. Large logits share one large
    offset (every token's feature 0 is 1) and spread less, so that no probability underflows
    to a tie. Tokens whose k-th and (k+1)-th largest logits (nearly) tie are left out: their
    experts would be a coin toss."""
    dtype, large = DTYPES[config["dtype"]], config["logits"] == "~100"
    x = tokens(config["tokens"], seed + 1).to(dtype)
    weight = gate_weight(config["experts"], seed + 2, LARGE_SPREAD if large else 1.0,
                         config["empty expert"])
    if large:
        weight[:, 0] += LARGE_OFFSET
    weight = weight.to(dtype)
    top = F.linear(x, weight).float().topk(min(config["top_k"] + 1, config["experts"])).values
    x = x[(top.diff(dim=-1) < -TIE_GAP).all(dim=-1)]
    return x, weight, seeded((len(x), config["top_k"]), seed + 3).to(dtype)


def route(router, config, seed):
    """One router call of module ``router`` on the inputs of ``config``, its gate's gradient of
    sum(weight * upstream) + AUX aux: what the checks compare, as data."""
    x, weight, upstream = router_inputs(config, seed)
    module = router.Router(HIDDEN, config["experts"], config["top_k"], config["capacity"],
                           config["renormalize"]).to(x.dtype)
    with torch.no_grad():
        module.gate.weight.copy_(weight)
    routing = module(x)
    ((routing.weight * upstream).sum() + AUX * routing.aux_loss).backward()
    return {"expert_index": routing.expert_index, "weight": routing.weight.detach(),
            "kept": routing.kept, "tokens_per_expert": routing.tokens_per_expert,
            "probabilities": routing.probabilities.detach(),
            "aux_loss": routing.aux_loss.detach(), "capacity": routing.capacity,
            "gate_grad": module.gate.weight.grad}


def router_alone(impl, configs, seed):
    router = impl.module("router")
    found = [route(router, config, config_seed(seed, i)) for i, config in enumerate(configs)]
    try:
        router.Router(HIDDEN, 4, 5)
        refusal = None
    except ValueError as error:
        refusal = str(error)
    return {"configs": found, "refusal": refusal}


def check_router(impl, run_alone, seed):
    """The router on every configuration of ``seed``'s sweep, against the reference's."""
    configs, wants = router_configs(seed), stored("router", seed)
    found = run_alone(router_alone, impl, configs, seed)
    dropped = 0
    for i, (config, want) in enumerate(zip(configs, wants)):
        actual, what = found["configs"][i], f"the router ({label(config, seed)})"
        blame(routing_problem(actual, want, config), what)
        assert actual["capacity"] == want["capacity"], (
            f"{what}: Routing.capacity is {actual['capacity']}, ceil(factor T k / E) is "
            f"{want['capacity']}")
        assert actual["gate_grad"] is not None, (
            f"{what}: the gate got no gradient: the weights and the aux loss must stay "
            "differentiable (no .detach(), no .item(), no torch.no_grad())")
        bf16 = config["dtype"] == "bf16"
        # in units of the largest element: the snapshot may come from another build of torch
        # (at logits ~100 one element of an fp32 gate gradient moved by 1.7e-5 on torch 2.11)
        scale = float(want["gate_grad"].abs().max()) or 1.0
        assert_close(actual["gate_grad"], want["gate_grad"], f"{what}: the gradient towards "
                     "the gate of sum(weight * g) + 0.1 aux", likely_cause="the weights and "
                     "the aux loss must stay differentiable and come from the softmax over all "
                     "experts", **(dict(atol=2e-2 * scale, rtol=2e-2) if bf16 else
                                   dict(atol=1e-5 * max(scale, 1.0), rtol=1e-4)))
        dropped += int((~actual["kept"]).sum())
    assert dropped > 0, f"seed {seed}: no configuration dropped anything (a weak sweep)"
    refusal = found["refusal"]
    assert refusal is not None, "Router(hidden, 4 experts, top_k = 5) was accepted: k > E"
    assert "5" in refusal and "4" in refusal, (
        f"Router with k = 5 > E = 4 raised ValueError({refusal!r}): name both numbers")


def test_router_alone(impl, run_alone, sweep_seed):
    check_router(impl, run_alone, sweep_seed)


# ----------------------------------------------------------------- layouts and groups

def parallelisms(seed):
    """name -> (data-parallel groups, ep) on 4 ranks."""
    pairs = group_layouts(WORLD, 2, seed)
    world = [list(range(WORLD))]
    return {"dp4-ep1": (world, 1), "dp4-ep2": (world, 2), "dp4-ep4": (world, 4),
            "dp2-consecutive-ep2": (pairs["consecutive"], 2),
            "dp2-strided-ep2": (pairs["strided"], 2),
            "dp2-permuted-ep2": (pairs["permuted"], 2),
            "dp2-strided-ep1": (pairs["strided"], 1)}


def groups_of_rank(groups, rank):
    """kind -> the group of ``groups`` (kind -> every group) that holds ``rank``."""
    return {kind: next(list(g) for g in found if rank in g) for kind, found in groups.items()}


def made_groups(groups):
    """The torch groups of ``groups`` (every rank makes every one, in order); this rank's."""
    rank, mine = dist.get_rank(), {}
    for kind, found in groups.items():
        for members in found:
            members = list(members)
            group = dist.group.WORLD if len(members) == WORLD else dist.new_group(members)
            if rank in members:
                mine[kind] = (group, members)
    return mine


# ----------------------------------------------------------------- tracing on the ranks

class SplitSizesDisagree(RuntimeError):
    """An all-to-all whose split sizes do not match its peers' or its tensors."""


def traced(exchanges: list, phase: list):
    """Trace this rank's collectives (``CommTracer``), and wrap ``all_to_all_single`` above the
    tracer: each all-to-all's split sizes are checked with the peers (refused on every rank
    at once, rather than left to hang) and its rows recorded in ``exchanges``. Returns
    (tracer, a function that undoes it all)."""
    real_all_to_all, real_all_reduce = dist.all_to_all_single, dist.all_reduce
    tracer = CommTracer().__enter__()
    traced_all_to_all = dist.all_to_all_single
    all_to_all_signature = inspect.signature(real_all_to_all)

    def all_to_all_single(*args, **kwargs):
        bound = all_to_all_signature.bind(*args, **kwargs).arguments
        output, input, group = bound.pop("output"), bound.pop("input"), bound.get("group")
        size = dist.get_world_size(group)
        sends = [int(n) for n in bound.get("input_split_sizes") or [len(input) // size] * size]
        receives = [int(n) for n in bound.get("output_split_sizes") or
                    [len(output) // size] * size]
        record = {"phase": phase[0], "sends": sends, "receives": receives,
                  "of rows": input.dim() > 1, "rows": input.detach().cpu().clone(),
                  "lengths": (len(input), len(output))}
        exchanges.append(record)
        theirs = torch.empty(size, dtype=torch.long, device=current_device())
        real_all_to_all(theirs, torch.tensor(sends, device=current_device()), group=group)
        problem = []
        if theirs.tolist() != receives:
            problem.append(f"it expects {receives} rows from the ranks of its group, which send "
                           f"it {theirs.tolist()}")
        if sum(sends) != len(input) or sum(receives) != len(output):
            problem.append(f"its splits add up to {sum(sends)} rows sent and {sum(receives)} "
                           f"received, its tensors have {len(input)} and {len(output)}")
        flag = torch.tensor([len(problem)], device=current_device())
        real_all_reduce(flag, op=dist.ReduceOp.MAX)  # the whole world stops together
        if int(flag):
            raise SplitSizesDisagree(f"all_to_all_single ({phase[0]}) with input splits {sends} "
                                     f"and output splits {receives}: "
                                     + ("; ".join(problem) or "another rank's splits disagree"))
        work = traced_all_to_all(output, input, **bound)
        if record["of rows"]:
            record["returned"] = output.detach().cpu().clone()
            record["call"] = len(tracer.calls)
        return work

    dist.all_to_all_single = all_to_all_single

    def undo():
        dist.all_to_all_single = traced_all_to_all
        tracer.__exit__(None, None, None)

    return tracer, undo


def row_exchanges(exchanges, phase="forward"):
    """The all-to-alls of token rows (not of counts) made in ``phase``."""
    return [e for e in exchanges if e["of rows"] and e["phase"] == phase]


def calls_between(tracer, start, end):
    return [call.as_data() for call in tracer.calls[start:end]]


# ----------------------------------------------------------------- the sync alone

def sync_gradients(config_index, rank, seed, experts_local):
    """Known gradients on ``rank``: (dense by position, expert by position)."""
    base = config_seed(seed, config_index) + 100 * rank
    dense = [seeded((4, HIDDEN), base + 1), seeded((HIDDEN,), base + 2)]
    expert = [seeded((FFN, HIDDEN) if j % 2 == 0 else (FFN,), base + 10 + j)
              for j in range(2 * experts_local)]
    return dense, expert


def sync_alone(impl, names, layouts, seed):
    """sync_moe_grads for each layout of ``names`` (name -> (its groups, ep) in ``layouts``),
    on groups made here: (gradients after by kind and position, the calls traced)."""
    from torch import nn

    rank, results, exchanges, phase = dist.get_rank(), [], [], ["sync_moe_grads"]
    made = [made_groups(layouts[name][0]) for name in names]
    tracer, undo = traced(exchanges, phase)
    try:
        expert_parallel = impl.module("expert_parallel")
        for i, name in enumerate(names):
            mine, ep = made[i], layouts[name][1]
            groups = SimpleNamespace(dp=mine["DP"][0], ep=mine["EP"][0], edp=mine["EDP"][0],
                                     dp_size=len(mine["DP"][1]), ep_size=ep,
                                     ep_rank=mine["EP"][1].index(rank))
            dense, expert = sync_gradients(i, rank, seed, 2)
            module, device = nn.Module(), current_device()
            module.router = nn.ParameterList(nn.Parameter(torch.zeros_like(g, device=device))
                                             for g in dense)
            module.experts = nn.ParameterList(nn.Parameter(torch.zeros_like(g, device=device))
                                              for g in expert)
            for parameter, grad in zip(module.parameters(), dense + expert):
                parameter.grad = grad.to(device)
            for parameter in module.experts.parameters():
                parameter.expert_parallel = True
            start = len(tracer.calls)
            expert_parallel.sync_moe_grads(module, groups)
            results.append({"dense": [p.grad.cpu() for p in module.router],
                            "expert": [p.grad.cpu() for p in module.experts],
                            "calls": calls_between(tracer, start, None)})
    finally:
        undo()
    return results


def sync_mistakes(kind):
    """(description, prediction) of each known mistake of the sync, for one gradient; ``o``
    holds the rank's groups and every rank's gradients at its position."""
    def total(o, ranks):
        return sum(o["before"][s] for s in ranks)

    world = range(WORLD)
    if kind == "dense":
        return [
            ("the dense gradients were not synced: each rank kept its own tokens' gradient",
             lambda o: o["before"][o["rank"]]),
            ("the dense gradients were averaged over the world, not the DP group (sum over "
             "the rank's data-parallel group, divide by its size dp)",
             lambda o: total(o, world) / WORLD),
            ("ReduceOp.AVG then divided again: an all-reduce with ReduceOp.AVG already "
             "divides by the group's size, so the division by dp after it divides twice",
             lambda o: total(o, o["DP"]) / len(o["DP"]) ** 2),
            ("the dense gradients were divided by the world size, not the data-parallel "
             "group's size dp", lambda o: total(o, o["DP"]) / WORLD),
            ("the dense gradients were summed over the DP group but not divided by dp",
             lambda o: total(o, o["DP"])),
            ("the dense gradients were divided by ep, not dp",
             lambda o: total(o, o["DP"]) / len(o["EP"])),
            ("the dense gradients were synced over the EDP group (the experts' copies), not "
             "the DP group", lambda o: total(o, o["EDP"]) / len(o["DP"])),
            ("the dense gradients were averaged over the EDP group (the experts' copies), not "
             "the DP group", lambda o: total(o, o["EDP"]) / len(o["EDP"])),
        ]
    return [
        ("the expert gradients were not synced over the EDP group",
         lambda o: o["before"][o["rank"]]),
        ("expert gradients averaged over the DP group instead of summed over the EDP group "
         "and divided by dp (the DP group mixes the gradients of other experts)",
         lambda o: total(o, o["DP"]) / len(o["DP"])),
        ("expert gradients divided by the EDP size instead of dp (ep times too large)",
         lambda o: total(o, o["EDP"]) / len(o["EDP"])),
        ("expert gradients summed over the EDP group but not divided by dp",
         lambda o: total(o, o["EDP"])),
        ("expert gradients divided by ep instead of dp", lambda o: total(o, o["EDP"]) / len(o["EP"])),
        ("ReduceOp.AVG then divided again: an all-reduce over the EDP group with "
         "ReduceOp.AVG already divides by its size, and the division by dp after it divides "
         "twice", lambda o: total(o, o["EDP"]) / len(o["EDP"]) / len(o["DP"])),
        ("the expert gradients were averaged over the world, not summed over the EDP group "
         "and divided by dp", lambda o: total(o, world) / WORLD),
        ("expert gradients divided by the world size instead of dp",
         lambda o: total(o, o["EDP"]) / WORLD),
    ]


def judge_sync(observations, kind, unit, only=None):
    """Fail on the first gradient of ``kind`` (of those labelled ``only``, if given) that is
    not the reference's (``o["right"]``), naming the known mistake that explains every
    observation of the sweep (or, failing that, this one)."""
    wrong = [o for o in observations if only in (None, o["label"]) and not torch.allclose(
        o["after"].double(), o["right"].double(), **TOLERANCE)]
    if not wrong:
        return
    def fits(o, predict):
        return torch.allclose(o["after"].double(), predict(o).double(), **MATCH)
    mistakes = sync_mistakes(kind)
    everywhere = [d for d, predict in mistakes if all(fits(o, predict) for o in observations)]
    first = wrong[0]
    here = [d for d, predict in mistakes if fits(first, predict)]
    if everywhere:
        cause = f"{everywhere[0]} (the one known mistake that fits every gradient of the sweep)"
    elif here:
        cause = f"{here[0]} (it fits this gradient, not every one of the sweep)"
    else:
        cause = ("every gradient must be that of the mean of the dp ranks' losses: see the "
                 "notebook's derivation of the sync")
    assert_close(first["after"], first["right"], f"{unit}: the {kind} gradient "
                 f"{first['name']} after sync_moe_grads ({first['label']})", rank=first["rank"],
                 likely_cause=f"{cause}. {len(wrong)} {kind} gradients are off here",
                 against="the reference's sync of the gradients it was given", **TOLERANCE)


def sync_contract(calls, mine, dense_bytes, expert_bytes, what, rank):
    """One all-reduce over the DP group (the dense bytes), one over the EDP group (the
    experts'); nothing over a group of one rank is counted (it moves nothing)."""
    wanted = [expected("all_reduce", mine[kind], nbytes)
              for kind, nbytes in (("DP", dense_bytes), ("EDP", expert_bytes))
              if len(mine[kind]) > 1 and nbytes]
    check_contract([c for c in calls if len(c["ranks"]) > 1], wanted, what, rank=rank,
                   formula="one bucketed all-reduce of the dense gradients over the DP group, "
                   "one of this rank's expert gradients over its EDP group")


def check_sync_alone(impl, run_on_ranks, seed):
    """sync_moe_grads on known gradients for every layout of ``seed``."""
    layouts, rights = stored("layouts", seed), stored("sync", seed)
    names = list(layouts)
    given = {name: (layouts[name], parallelisms(seed)[name][1]) for name in names}
    results = run_on_ranks(sync_alone, WORLD, impl, names, given, seed, timeout=TIMEOUT)
    observations = {"dense": [], "expert": []}
    for i, name in enumerate(names):
        before = [sync_gradients(i, r, seed, 2) for r in range(WORLD)]
        tag = label({"layout": name, "DP groups": layouts[name]["DP"]}, seed)
        for rank in range(WORLD):
            mine = groups_of_rank(layouts[name], rank)
            for k, kind in enumerate(("dense", "expert")):
                for j, after in enumerate(results[rank][i][kind]):
                    observations[kind].append(
                        {"rank": rank, "after": after, "name": f"at position {j}",
                         "label": tag, "before": {s: before[s][k][j] for s in range(WORLD)},
                         "right": rights[name][rank][kind][j], **mine})
    for kind in ("dense", "expert"):
        judge_sync(observations[kind], kind, "sync_moe_grads alone")
    for i, name in enumerate(names):
        dense, expert = sync_gradients(i, 0, seed, 2)
        for rank in range(WORLD):
            sync_contract(results[rank][i]["calls"], groups_of_rank(layouts[name], rank),
                          sum(g.numel() * 4 for g in dense), sum(g.numel() * 4 for g in expert),
                          f"sync_moe_grads alone ({label({'layout': name}, seed)})", rank)


def test_sync_moe_grads_alone(impl, run_on_ranks, sweep_seed):
    check_sync_alone(impl, run_on_ranks, sweep_seed)


# ----------------------------------------------------------------- the layer on ranks

LAYER_SPACE = {"parallelism": ["dp4-ep1", "dp4-ep2", "dp4-ep4", "dp2-consecutive-ep2",
                               "dp2-strided-ep2", "dp2-permuted-ep2", "dp2-strided-ep1"],
               "experts": [4, 8], "top_k": [1, 2], "capacity": [None, 1.0, 0.75],
               "tokens": [(7, 5, 7, 6), (3, 9, 1, 6), (8, 8, 8, 8)],
               "empty expert": [False, True]}


def layer_configs(seed):
    configs = draw(LAYER_SPACE, seed, extra=2)
    for config in configs:
        config["renormalize"] = config["top_k"] > 1  # Switch's raw weight at k = 1
    return configs


def layer_tokens(config, seed, index, rank, step):
    base = config_seed(seed, index) + 100 * step + 10 * rank
    return tokens(config["tokens"][rank], base + 500), seeded((config["tokens"][rank], HIDDEN),
                                                              base + 501)


def layer_on_rank(impl, configs, seed):
    """Every configuration on this rank, STEPS steps each: what the tests compare, as data."""
    from reference_impl.moe.moe_layer import MoELayer  # given; its experts are plain MLPs

    rank, device = dist.get_rank(), current_device()
    exchanges, phase, results = [], ["construction"], {"configs": [], "error": None}
    tracer, undo = traced(exchanges, phase)
    index, step = 0, 0
    try:
        expert_groups = impl.module("expert_groups")
        expert_parallel = impl.module("expert_parallel")
        made = {}
        for index, config in enumerate(configs):
            dp_groups, ep = parallelisms(seed)[config["parallelism"]]
            if config["parallelism"] not in made:
                made[config["parallelism"]] = expert_groups.create_expert_groups(ep, dp_groups)
            groups = made[config["parallelism"]]
            layer = MoELayer(HIDDEN, FFN, config["experts"], config["top_k"],
                             config["capacity"], config["renormalize"])
            with torch.no_grad():
                for what, parameter in layer.named_parameters():
                    parameter.copy_(layer_parameters(config, config_seed(seed, index))[what])
            parallel = expert_parallel.ExpertParallelMoE(layer.to(device), groups)
            optimizer = torch.optim.SGD(parallel.parameters(), lr=LR)
            steps = []
            results["configs"].append({
                "groups": {kind: dist.get_process_group_ranks(getattr(groups, kind.lower()))
                           for kind in ("DP", "EP", "EDP")}, "steps": steps})
            for step in range(STEPS):
                x, upstream = (t.to(device) for t in layer_tokens(config, seed, index, rank, step))
                x.requires_grad_()
                exchanges.clear()
                marks = [len(tracer.calls)]
                phase[0] = "forward"
                result = parallel(x)
                marks.append(len(tracer.calls))
                phase[0] = "backward"
                ((result.output * upstream).sum() + AUX * result.aux_loss).backward()
                marks.append(len(tracer.calls))
                before = [(what, None if p.grad is None else p.grad.detach().cpu().clone())
                          for what, p in parallel.named_parameters()]
                phase[0] = "sync_moe_grads"
                expert_parallel.sync_moe_grads(parallel, groups)
                marks.append(len(tracer.calls))
                routing = result.routings[0]
                steps.append({
                    "routing": {"expert_index": routing.expert_index.cpu(),
                                "weight": routing.weight.detach().cpu(),
                                "kept": routing.kept.cpu(),
                                "tokens_per_expert": routing.tokens_per_expert.cpu(),
                                "probabilities": routing.probabilities.detach().cpu(),
                                "aux_loss": routing.aux_loss.detach().cpu()},
                    "output": result.output.detach().cpu(), "aux_loss": result.aux_loss.detach().cpu(),
                    "input_grad": None if x.grad is None else x.grad.cpu(), "before": before,
                    "after": [(what, p.grad.detach().cpu().clone())
                              for what, p in parallel.named_parameters()],
                    "exchanges": row_exchanges(exchanges),
                    "calls": {name: calls_between(tracer, start, end) for name, start, end in
                              zip(("forward", "backward", "sync"), marks, marks[1:])},
                    "forward_start": marks[0]})
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                steps[-1]["stepped"] = [(what, p.detach().cpu().clone())
                                        for what, p in parallel.named_parameters()]
    except SplitSizesDisagree as error:  # every rank raised it: name it in the test
        results["error"] = {"error": str(error), "config": index, "step": step,
                            "exchanges": [{k: v for k, v in e.items() if k != "rows"}
                                          for e in exchanges]}
    finally:
        undo()
    return results


_LAUNCHES = {}  # (implementation, seed) -> the layer's results: one launch for three tests


def layer_results(impl, run_on_ranks, seed):
    key = (impl.name, seed)
    if key not in _LAUNCHES:
        _LAUNCHES[key] = run_on_ranks(layer_on_rank, WORLD, impl, layer_configs(seed), seed,
                                      timeout=TIMEOUT)
    return _LAUNCHES[key]


# ----------------------------------------------------------------- the reference's layer

def truth_of(seed, index):
    """The reference's layer on configuration ``index`` of ``seed``'s sweep: [rank][step] ->
    its groups, routing ("rule"), dispatch (the rows it sends, the splits), output, gradients
    before and after the sync (name -> tensor), and the outputs of known combine mistakes;
    with the weights after each SGD step, from the synced gradients."""
    truth = stored("layer", seed)[index]
    initial = layer_parameters(layer_configs(seed)[index], config_seed(seed, index))
    for steps in truth:
        weights = dict(initial)
        for me in steps:
            for key in ("before", "after"):
                if isinstance(me[key], torch.Tensor):
                    parts = me[key].split([math.prod(shape) for shape in me["shapes"]])
                    me[key] = {name: part.view(shape) for name, part, shape in
                               zip(me["held"], parts, me["shapes"])}
            weights = {**weights, **{n: weights[n] - LR * g for n, g in me["after"].items()}}
            me["stepped"] = {n: weights[n] for n in me["held"]}
    return truth


# ----------------------------------------------------------------- the units' verdicts

def rows_problem(rows, me):
    """Why the rows a dispatch sent are not the reference's (the kept assignments' tokens
    sorted by expert)."""
    if rows is None or tuple(rows.shape) != tuple(me["rows"].shape):
        return None  # the split sizes say it
    if torch.equal(rows, me["rows"]):
        return None
    if torch.equal(rows, me["rows in token order"]):
        return ("the dispatch did not sort tokens by expert: it sent the kept assignments in "
                "token order, so the rows for an EP rank's experts are not consecutive")
    if torch.equal(rows.sum(1).sort().values, me["rows"].sum(1).sort().values):
        return ("the dispatch sent the right rows in another order: the rows for each EP rank "
                "are consecutive, and within an expert in token order")
    return ("the dispatch sent other rows than the kept assignments' tokens (x[token], "
            "sorted by expert)")


def dispatch_problem(exchanges, me):
    """The first thing wrong with this rank's dispatch (its first all-to-all of rows in the
    forward), named; None when it is right."""
    rows = exchanges
    if not rows:
        return ("the dispatch made no all_to_all_single of token rows (use all_to_all_rows, "
                "named \"dispatch\")")
    first, sends, receives = rows[0], me["sends"], me["receives"]
    if first["sends"] == receives and first["receives"] == sends != receives:
        return (f"input and output split sizes swapped in the dispatch: this rank sends "
                f"{sends} rows to the ranks of its EP group and receives {receives}, its "
                f"all-to-all was given input splits {receives} and output splits {sends}")
    if first["sends"] == sends and first["receives"] == me["receives read transposed"] != receives:
        return (f"the dispatch's output splits {first['receives']} read the exchanged counts "
                f"in the wrong order: they arrive by source rank, E/ep from each, and the rows "
                f"from each rank are {receives}")
    if (first["sends"], first["receives"]) != (sends, receives):
        return (f"the dispatch should send {sends} rows to the ranks of its EP group "
                f"{me['EP']} and receive {receives}; its all-to-all had input splits "
                f"{first['sends']} and output splits {first['receives']} (input splits: the "
                "rows this rank's kept assignments send to each EP rank; output splits: the "
                "rows each EP rank sends it, from the exchanged counts)")
    if first["lengths"][0] != sum(sends):
        every = me["rule"]["kept"].numel()
        return (("the dispatch sent the dropped assignments too: " if first["lengths"][0] ==
                 every else "") + f"its rows tensor holds {first['lengths'][0]} rows, its "
                f"input splits add up to {sum(sends)}, this rank's kept assignments (only "
                "those travel; a dropped assignment stays home and adds 0)")
    return rows_problem(first.get("rows"), me)


COMBINE_MISTAKES = {
    "unweighted": "the expert outputs were not weighted by the router's weights",
    "not un-permuted": "the combine did not un-permute the tokens: the rows came back in the "
                       "order they were sent (by expert), and each must be added at its own "
                       "token's place",
    "weights in token order": "the combine took the weights in token order, not permuted with "
                              "the rows (by expert)"}


def combine_problem(step, me):
    """The first thing wrong with this rank's combine (its second all-to-all of rows in the
    forward, and the output it makes of the rows that came back), named; None when right."""
    rows = step["exchanges"]
    if len(rows) < 2:
        return ("the combine made no all_to_all_single of rows after the dispatch (use "
                "all_to_all_rows, named \"combine\")")
    dispatch, combine = rows[0], rows[1]
    if (combine["sends"], combine["receives"]) == (dispatch["sends"], dispatch["receives"]) \
            and dispatch["sends"] != dispatch["receives"]:
        return (f"the combine's split sizes are swapped: it must send back the rows it "
                f"received (input splits = the dispatch's output splits {dispatch['receives']}, "
                f"output splits = its input splits {dispatch['sends']}); it was given "
                f"{combine['sends']} and {combine['receives']}")
    if (combine["sends"], combine["receives"]) != (dispatch["receives"], dispatch["sends"]):
        return (f"the combine's splits {combine['sends']} (input), {combine['receives']} "
                f"(output) are not the dispatch's reversed ({dispatch['receives']}, "
                f"{dispatch['sends']})")
    if combine["lengths"] != (sum(dispatch["receives"]), sum(dispatch["sends"])):
        return (f"the combine sends {combine['lengths'][0]} rows and receives into "
                f"{combine['lengths'][1]}: it must send back every row the dispatch brought "
                f"({sum(dispatch['receives'])}) and receive every row this rank sent "
                f"({sum(dispatch['sends'])})")
    if "output" not in step or torch.allclose(step["output"], me["output"], **TOLERANCE):
        return None
    for key, cause in COMBINE_MISTAKES.items():
        if torch.allclose(step["output"], me["combine mistakes"][key], **MATCH):
            return cause
    error = (step["output"] - me["output"]).abs().max()
    return (f"the combine's output differs by up to {float(error):.3g} from the reference's: "
            "the rows that came back, weighted by their routing weights and added at their "
            "tokens' places")


def judge_error(results, configs, seed):
    """A launch stopped by split sizes that disagree: blame the exchange that failed."""
    error = results[0]["error"]
    if error is None:
        return
    config = configs[error["config"]]
    truth = truth_of(seed, error["config"])
    unit = None
    for rank, each in enumerate(results):
        me = truth[rank][each["error"]["step"]]
        failed = each["error"]["exchanges"][-1]
        if failed["phase"] != "forward":
            unit = (f"an all-to-all of the {failed['phase']}: the backward of all_to_all_rows "
                    "(token_exchange.py; test_all_to_all_alone grades it alone)")
            break
        if not failed["of rows"]:
            unit = ("the exchange of the counts: an all_to_all_single of routing."
                    "tokens_per_expert over the EP group, E/ep counts to each rank")
            break
        exchanges = row_exchanges(each["error"]["exchanges"])
        unit = dispatch_problem(exchanges[:1], me) if len(exchanges) < 2 \
            else combine_problem({"exchanges": exchanges[:2]}, me)
        if unit:
            break
    raise AssertionError(f"the layer's all-to-alls ({label(config, seed)}, step "
                         f"{error['step']}) stopped: {error['error']}. Likely cause: "
                         f"{unit or 'the split sizes each rank passes must agree'}")


def units_of(results, configs, seed, steps):
    """Yield (config, its label, step, rank, what the rank found, the reference's) for every
    configuration, step of ``steps`` and rank of a launch, in that order."""
    for index, config in enumerate(configs):
        truth = truth_of(seed, index)
        for step in steps:
            for rank in range(WORLD):
                found = results[rank]["configs"][index]
                yield config, label(config, seed), step, rank, found, truth[rank][step]


def groups_problem(found, me):
    for kind in ("DP", "EP", "EDP"):
        if sorted(found["groups"][kind]) != me[kind]:
            return (f"create_expert_groups gave this rank the {kind} group "
                    f"{sorted(found['groups'][kind])}, the reference's is {me[kind]} (see "
                    "test_lab9_expert_groups)")
    return None


def upstream_problem(config, step, found, me):
    """The groups or the router, which the dispatch and the combine rely on."""
    return groups_problem(found, me) or routing_problem(
        found["steps"][step]["routing"], me["rule"], config)


def each_rank(results, configs, seed, steps=(0,)):
    """Yield (config, its label, step, rank, what the rank found, the reference's) for every
    configuration, step and rank. The units are judged at step 0, where what they are given
    does not depend on the sync."""
    judge_error(results, configs, seed)
    yield from units_of(results, configs, seed, steps)


def blame(cause, where):
    """Fail with ``where: cause`` when there is a cause (the message alone, no repr of it)."""
    if cause:
        raise AssertionError(f"{where}: {cause}")


def unit_upstream(config, tag, step, rank, found, me, unit):
    blame(upstream_problem(config, step, found, me),
          f"the {unit} cannot be judged on rank {rank} ({tag}, step {step}): the groups or the "
          "router it is given are wrong (test_lab9_expert_groups, test_router_alone)")


def forward_contract(calls, me, what, rank, start, end, parts):
    """The all-to-alls over the EP group, with moe_costs' bytes plus the rows kept: a
    backward's are its forward's with the send and receive splits swapped."""
    if len(me["EP"]) == 1:
        return
    costs = all_to_all_bytes(me["counts_by_ep_rank"], me["ep_index"], HIDDEN)
    stay = me["sends"][me["ep_index"]] * ROW_BYTES
    experts = len(me["counts_by_ep_rank"][0])
    payloads = {"counts": experts * 8, "dispatch": costs.dispatch_forward + stay,
                "combine": costs.combine_forward + stay,
                "combine backward": costs.combine_backward + stay,
                "dispatch backward": costs.dispatch_backward + stay}
    wanted = [expected("all_to_all_single", me["EP"], payloads[part]) for part in parts]
    check_contract([c for c in calls[start:end] if len(c["ranks"]) > 1], wanted, what, rank=rank,
                   formula="moe_costs.all_to_all_bytes: the dispatch sends sum_{d != r} n[r][d] "
                   "rows of hidden fp32, the combine sum_{s != r} n[s][r], each backward its "
                   "forward's rows the other way, each traced with the rows the rank keeps; "
                   "the counts exchange E int64")


def check_dispatch(impl, run_on_ranks, seed):
    configs = layer_configs(seed)
    results = layer_results(impl, run_on_ranks, seed)
    for config, tag, step, rank, found, me in each_rank(results, configs, seed):
        unit_upstream(config, tag, step, rank, found, me, "dispatch")
        here = found["steps"][step]
        blame(dispatch_problem(here["exchanges"], me),
              f"the dispatch on rank {rank} ({tag}, step {step})")
        end = here["exchanges"][0]["call"] - here["forward_start"]
        forward_contract(here["calls"]["forward"], me, f"the dispatch ({tag}, step {step})",
                         rank, 0, end, ["counts", "dispatch"])


def test_dispatch_alone(impl, run_on_ranks, sweep_seed):
    check_dispatch(impl, run_on_ranks, sweep_seed)


def check_combine(impl, run_on_ranks, seed):
    configs = layer_configs(seed)
    results = layer_results(impl, run_on_ranks, seed)
    for config, tag, step, rank, found, me in each_rank(results, configs, seed):
        unit_upstream(config, tag, step, rank, found, me, "combine")
        here = found["steps"][step]
        blame(dispatch_problem(here["exchanges"], me),
              f"the combine cannot be judged on rank {rank} ({tag}, step {step}): the "
              "dispatch it reverses is wrong (test_dispatch_alone)")
        blame(combine_problem(here, me), f"the combine on rank {rank} ({tag}, step {step})")
        start = here["exchanges"][0]["call"] - here["forward_start"]
        forward_contract(here["calls"]["forward"], me, f"the combine ({tag}, step {step})",
                         rank, start, None, ["combine"])


def test_combine_alone(impl, run_on_ranks, sweep_seed):
    check_combine(impl, run_on_ranks, sweep_seed)


def unit_problem(config, step, found, me):
    """Which unit the layer's failure comes from (they each have a test), or None."""
    here = found["steps"][step]
    for unit, cause in (("router or groups", upstream_problem(config, step, found, me)),
                        ("dispatch", dispatch_problem(here["exchanges"], me)),
                        ("combine", combine_problem(here, me))):
        if cause:
            return f"the {unit} is wrong: {cause}"
    return None


COMPOSITION = ("the router, the dispatch and the combine each pass on their own (test_router_"
               "alone, test_dispatch_alone, test_combine_alone), so the composition is wrong: ")


def check_layer(impl, run_on_ranks, seed):
    configs = layer_configs(seed)
    results = layer_results(impl, run_on_ranks, seed)
    judge_error(results, configs, seed)
    observations = {"dense": [], "expert": []}  # the whole sweep's, to name a sync mistake
    for config, tag, step, rank, _, me in units_of(results, configs, seed, range(STEPS)):
        observe(observations, results, configs.index(config), step, rank, tag, me)
    dropped, empty, seen = 0, 0, None
    for config, tag, step, rank, found, me in units_of(results, configs, seed, range(STEPS)):
        if seen not in (None, (tag, step)):
            judge_step(results, configs, seed, observations, *seen)
        seen = (tag, step)
        compose(config, tag, step, rank, found, me)
        dropped += int((~me["rule"]["kept"]).sum())
        empty += me["receives"].count(0)
    judge_step(results, configs, seed, observations, *seen)
    assert dropped > 0 and empty > 0, (
        f"seed {seed}: the sweep dropped {dropped} assignments and left {empty} splits "
        "empty: a weak sweep")


def test_layer_matches_one_device(impl, run_on_ranks, sweep_seed):
    check_layer(impl, run_on_ranks, sweep_seed)


def compose(config, tag, step, rank, found, me):
    """One rank's step up to the sync: the units, then what they make together."""
    here, what = found["steps"][step], f"the layer ({tag}, step {step})"
    blame(unit_problem(config, step, found, me), f"{what} on rank {rank}")
    assert_close(here["output"], me["output"], f"{what}: the output", rank=rank,
                 likely_cause=COMPOSITION + "the rows were run by the wrong local experts: "
                 "the exchanged counts decide which local expert runs each received row",
                 **TOLERANCE)
    assert_close(here["aux_loss"], me["rule"]["aux_loss"], f"{what}: the aux loss",
                 rank=rank, likely_cause=COMPOSITION + "each rank routes its own tokens",
                 **TOLERANCE)
    assert here["input_grad"] is not None, f"{what} on rank {rank}: x got no gradient"
    assert_close(here["input_grad"], me["input_grad"], f"{what}: the input's gradient",
                 rank=rank, likely_cause=COMPOSITION + "the dispatch and the combine are "
                 "all-to-alls whose backward brings each row's gradient home (all_to_all_"
                 "rows and its backward in token_exchange.py, graded alone by "
                 "test_all_to_all_alone)", **TOLERANCE)
    for name, before in here["before"]:
        assert before is not None, f"{what} on rank {rank}: {name} has no gradient"
        assert_close(before, me["before"][name], f"{what}: the gradient of {name} before the "
                     "sync", rank=rank, likely_cause=COMPOSITION + "the router's is this "
                     "rank's loss's; an expert's, its EP group's losses'", **TOLERANCE)
    forward_contract(here["calls"]["backward"], me, f"{what}'s backward", rank, 0, None,
                     ["combine backward", "dispatch backward"])


def judge_step(results, configs, seed, observations, tag, step):
    """The sync of one configuration's step (named from the whole sweep), then every rank's
    gradients after it, its weights after the SGD step and its all-reduces."""
    for kind in ("dense", "expert"):
        judge_sync(observations[kind], kind, "sync_moe_grads in the layer",
                   only=f"{tag}, step {step}")
    index = [label(config, seed) for config in configs].index(tag)
    truth = truth_of(seed, index)
    for rank in range(WORLD):
        here, me = results[rank]["configs"][index]["steps"][step], truth[rank][step]
        what = f"the layer ({tag}, step {step})"
        for name, after in here["after"]:
            assert_close(after, me["after"][name], f"{what}: the gradient of {name} after "
                         "sync_moe_grads", rank=rank, against="the single-device gradient of "
                         "the DP group's mean loss", likely_cause=COMPOSITION, **TOLERANCE)
        for name, value in here["stepped"]:
            assert_close(value, me["stepped"][name], f"{what}: {name} after an SGD step",
                         rank=rank, likely_cause="the step must follow the synced gradients",
                         **TOLERANCE)
        dense = sum(v.numel() * 4 for n, v in here["after"] if n.startswith("router."))
        expert = sum(v.numel() * 4 for n, v in here["after"] if not n.startswith("router."))
        sync_contract(here["calls"]["sync"], me, dense, expert, f"sync_moe_grads in {what}",
                      rank)


def observe(observations, results, index, step, rank, tag, me):
    """Each gradient of ``rank`` after the sync, with every rank's at its position."""
    positions = {}
    for s in range(WORLD):
        here = results[s]["configs"][index]["steps"][step]
        for kind in ("dense", "expert"):
            listed = [torch.zeros_like(a) if b is None else b for (n, b), (_, a) in
                      zip(here["before"], here["after"])
                      if n.startswith("router.") == (kind == "dense")]
            positions.setdefault(kind, {})[s] = listed
    here = results[rank]["configs"][index]["steps"][step]
    for kind in ("dense", "expert"):
        names = [n for n, _ in here["after"] if n.startswith("router.") == (kind == "dense")]
        afters = [g for n, g in here["after"] if n.startswith("router.") == (kind == "dense")]
        for j, (name, after) in enumerate(zip(names, afters)):
            if any(j >= len(positions[kind][s]) or positions[kind][s][j].shape != after.shape
                   for s in range(WORLD)) or name not in me["after"]:
                continue
            observations[kind].append(
                {"rank": rank, "after": after, "name": name, "label": f"{tag}, step {step}",
                 "before": {s: positions[kind][s][j] for s in range(WORLD)},
                 "right": me["after"][name], "DP": me["DP"], "EP": me["EP"], "EDP": me["EDP"]})
