"""Lab 9, graded: the top-k router (``router.py``) and the expert-parallel MoE layer
(``expert_parallel.py``: dispatch, combine, gradient sync), against a single-device
mixture of experts written here.

The single-device layer of this file routes plainly, one token at a time: probabilities =
softmax over all E experts of the gate's logits, each token's k most probable experts, weights
renormalised over the k (or the raw probabilities), then each expert keeps the first
``capacity = ceil(factor T k / E)`` of its assignments in token order and drops the rest (no
limit when dropless); y_t = sum over kept slots of weight * expert(x_t); the Switch loss
E sum_e f_e P_e over the assignments before dropping.

* **The router alone** (one helper process): k = 1 and 2, renormalised or raw weights,
  capacity factors 1.0 and 1.25 and dropless, 13 tokens (divides nothing): the experts, the
  weights and their gradient towards the gate, what was kept, the counts, the aux loss; and
  the refusal of k > E.
* **The layer on 4 ranks**, one launch per EP size: ep = 2 (two EP groups at once, EDP groups of
  2) and ep = 4, each with k = 1 and 2, dropping and dropless, 7, 5, 7, 6 tokens per rank. Each
  rank routes its own tokens (its own capacity, GShard's per-group capacity), so the
  single-device layer routes each rank's tokens as a group of their own. Rank r's loss is
  L_r = sum(y_r * g_r) + 0.1 aux_r, the single device's their mean. Checked: the groups, the
  dispatch's split sizes, outputs, aux loss, input gradients, every gradient before and after
  ``sync_moe_grads`` (the router's: rank r's own loss; an expert's: its EP group's losses; after
  the sync, the mean loss's), the weights after an SGD step.

Before the submission is loaded, each rank wraps ``dist.all_to_all_single``: every call is
recorded with its split sizes, and the ranks first exchange their split sizes and check that
what each sends is what its peer expects (refused by name otherwise, rather than left to hang).

Tolerance (fp32): 1e-5 absolute and relative; observed about 2e-7 (the same products, summed in
another order).
"""
import inspect
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device

pytestmark = pytest.mark.lab9

HIDDEN, FFN, AUX, LR = 8, 16, 0.1, 0.1
TOLERANCE = dict(atol=1e-5, rtol=1e-5)
WORLD, COUNTS = 4, (7, 5, 7, 6)
TIMEOUT = 120


# ----------------------------------------------------------------- the single-device layer

def seeded(shape, seed, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def layer_parameters(experts, seed=0):
    """name -> value of a MoE layer's parameters (the names of ``moe_layer.MoELayer``)."""
    found = {"router.gate.weight": seeded((experts, HIDDEN), seed, 0.5)}
    for e in range(experts):
        for layer, shape in (("fc1", (FFN, HIDDEN)), ("fc2", (HIDDEN, FFN))):
            found[f"experts.{e}.{layer}.weight"] = seeded(shape, seed + 10 * e + 1, 0.3)
            found[f"experts.{e}.{layer}.bias"] = seeded(shape[:1], seed + 10 * e + 2, 0.1)
    return found


def route(gate_weight, x, top_k, capacity_factor, renormalize):
    """The routing of x (T, hidden), one token at a time: (expert index (T, k), weight (T, k),
    kept (T, k), aux loss)."""
    experts = gate_weight.shape[0]
    probabilities = (x @ gate_weight.t()).float().softmax(dim=-1)
    top, index = probabilities.topk(top_k, dim=-1)
    weight = top / top.sum(dim=-1, keepdim=True) if renormalize else top
    capacity = math.inf if capacity_factor is None else \
        math.ceil(capacity_factor * x.shape[0] * top_k / experts)
    taken, kept = [0] * experts, torch.zeros_like(index, dtype=torch.bool)
    for t in range(x.shape[0]):
        for s in range(top_k):
            e = int(index[t, s])
            kept[t, s] = taken[e] < capacity
            taken[e] += 1
    fraction = torch.bincount(index.flatten(), minlength=experts).float() / index.numel()
    aux = experts * (fraction * probabilities.mean(dim=0)).sum()
    return index, weight, kept, aux


def expert(params, e, x):
    hidden = F.gelu(F.linear(x, params[f"experts.{e}.fc1.weight"], params[f"experts.{e}.fc1.bias"]))
    return F.linear(hidden, params[f"experts.{e}.fc2.weight"], params[f"experts.{e}.fc2.bias"])


def moe(params, x, routing, weighted=True):
    """y_t = sum over t's kept slots of weight * expert(x_t)."""
    index, weight, kept, _ = routing
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for s in range(index.shape[1]):
            if kept[t, s]:
                out = expert(params, int(index[t, s]), x[t])
                y[t] = y[t] + (weight[t, s] * out if weighted else out)
    return y


# ----------------------------------------------------------------- the router alone

ROUTER_CASES = {  # name: (experts, top_k, capacity factor, renormalize)
    "k2-renormalized-capacity1": (4, 2, 1.0, True),
    "k2-raw-capacity1.25": (4, 2, 1.25, False),
    "k1-raw-capacity1": (4, 1, 1.0, False),
    "k1-renormalized-dropless": (4, 1, None, True),
    "k2-raw-dropless-E8": (8, 2, None, False),
}
ROUTER_TOKENS = 13


def router_alone(impl):
    router = impl.module("router")
    found = {}
    for name, (experts, top_k, capacity_factor, renormalize) in ROUTER_CASES.items():
        module = router.Router(HIDDEN, experts, top_k, capacity_factor, renormalize)
        with torch.no_grad():
            module.gate.weight.copy_(layer_parameters(experts)["router.gate.weight"])
        routing = module(seeded((ROUTER_TOKENS, HIDDEN), 7))
        (routing.weight * seeded(routing.weight.shape, 8)).sum().backward()
        found[name] = {"expert_index": routing.expert_index, "weight": routing.weight.detach(),
                       "kept": routing.kept, "tokens_per_expert": routing.tokens_per_expert,
                       "aux_loss": routing.aux_loss.detach(), "capacity": routing.capacity,
                       "gate_grad": module.gate.weight.grad}
    try:
        router.Router(HIDDEN, 4, 5)
        found["refusal"] = None
    except ValueError as error:
        found["refusal"] = str(error)
    return found


def router_mistake(found, expected, x, gate, case):
    """The named mistake the router's weights or drops show, or a generic hint."""
    experts, top_k, capacity_factor, renormalize = case
    index = expected[0]
    logits = (x @ gate.t()).float()
    over_top_k = logits.gather(1, index).softmax(dim=-1)
    if not renormalize and torch.allclose(found["weight"].double(), over_top_k.double(), atol=1e-6):
        return ("the softmax was taken over the top-k only: the probabilities are a softmax over "
                "all E experts, then the k largest are taken (with renormalize=False the weights "
                "are those probabilities, and need not add up to 1)")
    probabilities = logits.softmax(dim=-1).gather(1, index)
    if renormalize and torch.allclose(found["weight"].double(), probabilities.double(), atol=1e-6):
        return ("the weights were not renormalised over the k chosen experts "
                "(renormalize=True: p / sum of the k p's, so a token's weights add up to 1)")
    if capacity_factor is not None:
        capacity = math.ceil(capacity_factor * ROUTER_TOKENS * top_k / experts)
        counts = torch.bincount(found["expert_index"][found["kept"]], minlength=experts)
        if (counts > capacity).any():
            return (f"tokens past capacity were kept: an expert kept {int(counts.max())} "
                    f"assignments, its capacity is ceil({capacity_factor} x {ROUTER_TOKENS} x "
                    f"{top_k} / {experts}) = {capacity}")
        slot_major = torch.zeros_like(index, dtype=torch.bool)
        taken = [0] * experts
        for s in range(top_k):
            for t in range(ROUTER_TOKENS):
                slot_major[t, s] = taken[int(index[t, s])] < capacity
                taken[int(index[t, s])] += 1
        if top_k > 1 and torch.equal(found["kept"], slot_major) and \
                not torch.equal(slot_major, expected[2]):
            return ("the capacity queue counted slot by slot (every token's first choice before "
                    "any second choice): an expert's assignments queue in token order, a token's "
                    "slots together")
        if torch.equal(found["kept"].flip(0), route(gate, x.flip(0), top_k, capacity_factor,
                                                    renormalize)[2]):
            return "the last assignments were kept instead of the first, in token order"
    return ("see the router's rule in router.py's docstring: softmax over all experts, top-k, "
            "weights, then the first `capacity` assignments of each expert in token order")


def test_router_top_k_weights_and_capacity(impl, run_alone):
    found = run_alone(router_alone, impl)
    x = seeded((ROUTER_TOKENS, HIDDEN), 7)
    dropped = 0
    for name, case in ROUTER_CASES.items():
        experts, top_k, capacity_factor, renormalize = case
        gate = layer_parameters(experts)["router.gate.weight"].requires_grad_()
        expected = route(gate, x, top_k, capacity_factor, renormalize)
        (expected[1] * seeded(expected[1].shape, 8)).sum().backward()
        actual = found[name]
        what = f"{name} (E = {experts}, k = {top_k}, capacity factor {capacity_factor})"
        assert torch.equal(actual["expert_index"].cpu(), expected[0]), (
            f"{what}: the experts chosen differ from each token's k most probable experts "
            f"(got {actual['expert_index'].tolist()}, expected {expected[0].tolist()}), most "
            "probable first")
        cause = router_mistake(actual, expected, x, gate.detach(), case)
        assert_close(actual["weight"], expected[1], f"{what}: the routing weights",
                     likely_cause=cause, **TOLERANCE)
        assert_close(actual["gate_grad"], gate.grad, f"{what}: the gradient of the weights "
                     "towards the gate", likely_cause="the weights must stay differentiable "
                     "(no .detach(), no .item()) and come from the softmax over all experts",
                     **TOLERANCE)
        assert torch.equal(actual["kept"].cpu(), expected[2]), (
            f"{what}: kept {actual['kept'].int().tolist()}, expected "
            f"{expected[2].int().tolist()}. {router_mistake(actual, expected, x, gate.detach(), case)}")
        counts = torch.bincount(expected[0][expected[2]], minlength=experts)
        assert actual["tokens_per_expert"].tolist() == counts.tolist(), (
            f"{what}: tokens_per_expert {actual['tokens_per_expert'].tolist()}, the kept "
            f"assignments per expert are {counts.tolist()}")
        assert_close(actual["aux_loss"], expected[3], f"{what}: the Switch aux loss",
                     likely_cause="E sum_e f_e P_e, f_e over every assignment before dropping, "
                     "P_e the mean probability over all tokens", **TOLERANCE)
        dropped += int((~expected[2]).sum())
    assert dropped > 0, "no case dropped anything: the capacity rule went untested"
    refusal = found["refusal"]
    assert refusal is not None, "Router(hidden, 4 experts, top_k = 5) was accepted: k > E"
    assert "5" in refusal and "4" in refusal, (
        f"Router with k = 5 > E = 4 raised ValueError({refusal!r}): name both numbers")


# ----------------------------------------------------------------- the layer on ranks

CONFIGS = {  # name: (ep, experts, top_k, capacity factor, renormalize)
    "ep2": {"ep2-E4-k2-capacity1": (2, 4, 2, 1.0, True),
            "ep2-E4-k1-dropless": (2, 4, 1, None, False)},
    "ep4": {"ep4-E8-k1-capacity1": (4, 8, 1, 1.0, False),
            "ep4-E4-k2-dropless": (4, 4, 2, None, True)},
}


def tokens_of(rank):
    return seeded((COUNTS[rank], HIDDEN), 100 + rank), seeded((COUNTS[rank], HIDDEN), 200 + rank)


class SplitSizesDisagree(RuntimeError):
    """An all-to-all whose split sizes do not match its peers' or its tensors."""


def record_all_to_alls(calls: list, phase: list):
    """Wrap ``dist.all_to_all_single`` on this rank: record each call's split sizes, and refuse,
    on every rank of the group at once, splits that disagree. Returns the original."""
    original = dist.all_to_all_single
    signature = inspect.signature(original)

    def checked(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        output, input, group = bound["output"], bound["input"], bound.get("group")
        size = dist.get_world_size(group)
        sends = bound.get("input_split_sizes") or [input.shape[0] // size] * size
        receives = bound.get("output_split_sizes") or [output.shape[0] // size] * size
        sends, receives = [int(n) for n in sends], [int(n) for n in receives]
        calls.append({"phase": phase[0], "sends": sends, "receives": receives,
                      "rows": input.dim() > 1})  # tokens' rows, not counts
        theirs = torch.empty(size, dtype=torch.long, device=current_device())
        original(theirs, torch.tensor(sends, device=current_device()), group=group)
        problem = []
        if theirs.tolist() != receives:
            problem.append(f"it expects {receives} rows from the ranks of its group, which send "
                           f"it {theirs.tolist()}")
        if sum(sends) != input.shape[0] or sum(receives) != output.shape[0]:
            problem.append(f"its splits add up to {sum(sends)} rows sent and {sum(receives)} "
                           f"received, its tensors have {input.shape[0]} and {output.shape[0]}")
        flag = torch.tensor([len(problem)], device=current_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if int(flag):
            raise SplitSizesDisagree(f"all_to_all_single ({phase[0]}) with input splits {sends} "
                                     f"and output splits {receives}: "
                                     + ("; ".join(problem) or "another rank's splits disagree"))
        return original(*args, **kwargs)

    dist.all_to_all_single = checked
    return original


def layer_on_rank(impl, ep_name):
    """Every config of ``ep_name`` on this rank: what the test compares, as data."""
    from reference_impl.moe.moe_layer import MoELayer  # given; its experts are plain MLPs

    rank, device = dist.get_rank(), current_device()
    calls, phase = [], ["construction"]
    original = record_all_to_alls(calls, phase)  # before the submission runs in this process
    results = {}
    try:
        expert_groups = impl.module("expert_groups")
        expert_parallel = impl.module("expert_parallel")
        made = {}
        for name, (ep, experts, top_k, capacity_factor, renormalize) in CONFIGS[ep_name].items():
            calls.clear()
            if ep not in made:
                made[ep] = expert_groups.create_expert_groups(ep)
            groups = made[ep]
            layer = MoELayer(HIDDEN, FFN, experts, top_k, capacity_factor, renormalize)
            with torch.no_grad():
                for what, parameter in layer.named_parameters():
                    parameter.copy_(layer_parameters(experts)[what])
            parallel = expert_parallel.ExpertParallelMoE(layer.to(device), groups)
            x, upstream = (t.to(device) for t in tokens_of(rank))
            x.requires_grad_()
            phase[0] = "forward"
            result = parallel(x)
            phase[0] = "backward"
            ((result.output * upstream).sum() + AUX * result.aux_loss).backward()
            before = {what: p.grad.detach().cpu().clone() for what, p in parallel.named_parameters()
                      if p.grad is not None}
            phase[0] = "sync_moe_grads"
            expert_parallel.sync_moe_grads(parallel, groups)
            after = {what: p.grad.detach().cpu().clone() for what, p in parallel.named_parameters()}
            torch.optim.SGD(parallel.parameters(), lr=LR).step()
            results[name] = {
                "ep_group": dist.get_process_group_ranks(groups.ep),
                "output": result.output.detach().cpu(), "aux_loss": result.aux_loss.detach().cpu(),
                "input_grad": x.grad.cpu(), "before": before, "after": after,
                "stepped": {what: p.detach().cpu() for what, p in parallel.named_parameters()},
                "calls": list(calls), "error": None}
    except SplitSizesDisagree as error:  # every rank of the group raised it: name it in the test
        results["error"] = {"error": str(error), "calls": list(calls), "config": name}
    finally:
        dist.all_to_all_single = original
    return results


def single_device(config):
    """Per rank: routing, outputs, losses; and the gradients and weights the test expects."""
    ep, experts, top_k, capacity_factor, renormalize = config
    params = {what: value.requires_grad_() for what, value in layer_parameters(experts).items()}
    xs = [tokens_of(r)[0].requires_grad_() for r in range(WORLD)]
    per_rank = []
    for r in range(WORLD):
        routing = route(params["router.gate.weight"], xs[r], top_k, capacity_factor, renormalize)
        y = moe(params, xs[r], routing)
        loss = (y * tokens_of(r)[1]).sum() + AUX * routing[3]
        per_rank.append({"routing": routing, "output": y, "loss": loss,
                         "unweighted": moe(params, xs[r], routing, weighted=False)})
    names = list(params)

    def grads(loss):
        found = torch.autograd.grad(loss, [params[n] for n in names], retain_graph=True,
                                    allow_unused=True)
        return {n: torch.zeros_like(params[n]) if g is None else g for n, g in zip(names, found)}

    mean = grads(sum(each["loss"] for each in per_rank) / WORLD)
    for r, each in enumerate(per_rank):
        each["input_grad"] = torch.autograd.grad(each["loss"], xs[r], retain_graph=True)[0]
        each["own"] = grads(each["loss"])                       # the router's, before the sync
        first = r // ep * ep
        each["ep_group"] = list(range(first, first + ep))
        each["group"] = grads(sum(per_rank[s]["loss"] for s in each["ep_group"]))  # experts'
        each["edp_group"] = list(range(r % ep, WORLD, ep))
    return per_rank, {n: g.detach() for n, g in mean.items()}, \
        {n: (p - LR * mean[n]).detach() for n, p in params.items()}


def expected_splits(per_rank, rank, ep, experts):
    """The dispatch's (input, output) split sizes on ``rank``: kept rows to and from each rank
    of its EP group."""
    def to_ranks(r):
        index, _, kept, _ = per_rank[r]["routing"]
        counts = torch.bincount(index[kept], minlength=experts).view(ep, -1).sum(dim=1)
        return counts.tolist()
    group = per_rank[rank]["ep_group"]
    return to_ranks(rank), [to_ranks(s)[group.index(rank)] for s in group]


def check_dispatch(calls, per_rank, rank, ep, experts, name):
    sends, receives = expected_splits(per_rank, rank, ep, experts)
    forward = [call for call in calls if call["phase"] == "forward" and call["rows"]][:1]
    if any(call["sends"] == receives and call["receives"] == sends != receives for call in forward):
        return (f"{name}, rank {rank}: input and output split sizes swapped in the dispatch: this "
                f"rank sends {sends} rows to the ranks of its EP group and receives {receives}, "
                f"its all-to-all was given input splits {receives} and output splits {sends}")
    if not any(call["sends"] == sends and call["receives"] == receives for call in forward):
        return (f"{name}, rank {rank}: the dispatch should send {sends} rows to the ranks of "
                f"its EP group and receive {receives}; its first all-to-all of rows in the forward "
                f"had {[(c['sends'], c['receives']) for c in forward] or 'none'} (input, output "
                "splits): input splits are the rows this rank's kept assignments send to each EP "
                "rank, output splits the rows each EP rank sends it (from the exchanged counts)")
    return None


def expert_of(what):
    return int(what.split(".")[1]) if what.startswith("experts.") else None


def sync_mistakes(per_rank, rank, ep, what):
    """The gradient ``what`` on ``rank`` after each usual mistake of the sync."""
    dp, me = WORLD, per_rank[rank]
    if expert_of(what) is None:
        own = me["own"][what]
        return {"the router's gradient not synced: each rank kept its own tokens' gradient":
                own,
                "the router's gradient summed over the DP group, not divided by dp":
                sum(per_rank[s]["own"][what] for s in range(dp)),
                f"the router's gradient averaged over the EDP group ({len(me['edp_group'])} "
                "ranks), not over the DP group":
                sum(per_rank[s]["own"][what] for s in me["edp_group"]) / len(me["edp_group"])}
    summed = sum(per_rank[s]["group"][what] for s in me["edp_group"])
    # The DP average mixes other experts: rank s's j-th local expert in place of this rank's.
    experts = sum(1 for n in me["group"] if n.endswith(".fc1.weight"))
    per = experts // ep
    j = expert_of(what) % per
    suffix = what.split(".", 2)[2]
    mixed = sum(per_rank[s]["group"][f"experts.{(s % ep) * per + j}.{suffix}"]
                for s in range(dp)) / dp
    return {"expert gradients averaged over the DP group instead of summed over the EDP group "
            "and divided by dp (the DP group mixes the gradients of other experts)": mixed,
            f"expert gradients divided by the EDP size {dp // ep} instead of dp = {dp} ({ep}x "
            "too large)": summed / (dp // ep),
            "expert gradients summed over the EDP group but not divided by dp": summed,
            "expert gradients not synced over the EDP group": me["group"][what]}


def named(actual, mistakes, otherwise):
    for description, value in mistakes.items():
        if torch.allclose(actual.double(), value.detach().double(), atol=1e-6, rtol=1e-5):
            return description
    return otherwise


@pytest.mark.parametrize("ep_name", CONFIGS)
def test_expert_parallel_layer_matches_one_device(impl, run_on_ranks, ep_name):
    results = run_on_ranks(layer_on_rank, WORLD, impl, ep_name, timeout=TIMEOUT)
    for rank, found in enumerate(results):
        if "error" in found:
            name = found["error"]["config"]
            per_rank, _, _ = single_device(CONFIGS[ep_name][name])
            ep, experts = CONFIGS[ep_name][name][:2]
            cause = check_dispatch(found["error"]["calls"], per_rank, rank, ep, experts, name)
            raise AssertionError(f"rank {rank}: {found['error']['error']}. "
                                 f"{cause or 'the split sizes each rank passes must agree'}")
    for name, config in CONFIGS[ep_name].items():
        ep, experts = config[:2]
        per_rank, mean_grads, stepped = single_device(config)
        dropped = sum(int((~each["routing"][2]).sum()) for each in per_rank)
        assert (dropped > 0) == (config[3] is not None), f"{name}: {dropped} drops, a weak case"
        for rank, each in enumerate(results):
            found, me = each[name], per_rank[rank]
            assert found["ep_group"] == me["ep_group"], (
                f"{name}, rank {rank}: its EP group is {found['ep_group']}, expected "
                f"{me['ep_group']}"
                + (": EP groups strided instead of consecutive ranks"
                   if found["ep_group"] == me["edp_group"] or ep < WORLD and
                   found["ep_group"] == list(range(rank % (WORLD // ep), WORLD, WORLD // ep)) else ""))
            dispatch = check_dispatch(found["calls"], per_rank, rank, ep, experts, name)
            assert dispatch is None, dispatch
            expected = me["output"].detach()
            if torch.allclose(found["output"].sum(0).double(), expected.sum(0).double(),
                              **TOLERANCE):
                cause = ("the combine did not un-permute the tokens: the rows came back in the "
                         "order they were sent (by expert), and each must be added at its own "
                         "token's place")
            else:
                cause = named(found["output"], {
                    "the expert outputs were not weighted by the router's weights":
                        me["unweighted"]}, "see the combine's steps in expert_parallel.py")
            assert_close(found["output"], expected, f"{name}: the layer's output", rank=rank,
                         likely_cause=cause, **TOLERANCE)
            assert_close(found["aux_loss"], me["routing"][3], f"{name}: the aux loss",
                         rank=rank, likely_cause="each rank routes its own tokens",
                         **TOLERANCE)
            assert_close(found["input_grad"], me["input_grad"], f"{name}: the input's gradient",
                         rank=rank, likely_cause="the dispatch and the combine are all-to-alls "
                         "whose backward brings each row's gradient home", **TOLERANCE)
            for what, value in found["after"].items():
                before = found["before"].get(what)
                want = me["own"][what] if expert_of(what) is None else me["group"][what]
                assert before is not None, f"{name}, rank {rank}: {what} has no gradient"
                assert_close(before, want, f"{name}: the gradient of {what} before the sync",
                             rank=rank, likely_cause="the router's is this rank's loss's; an "
                             "expert's, its EP group's losses'", **TOLERANCE)
                cause = named(value, sync_mistakes(per_rank, rank, ep, what),
                              "dense gradients summed over the DP group, expert gradients over "
                              "the EDP group, both divided by dp")
                assert_close(value, mean_grads[what], f"{name}: the gradient of {what} after "
                             "sync_moe_grads", rank=rank, likely_cause=cause,
                             against="the single-device gradient of the mean loss", **TOLERANCE)
                assert_close(found["stepped"][what], stepped[what], f"{name}: {what} after an "
                             "SGD step", rank=rank, **TOLERANCE)
