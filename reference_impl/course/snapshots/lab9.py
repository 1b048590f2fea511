"""Lab 9's expected values: the reference's router, EP and EDP groups, gradient sync, expert-
parallel layer (computed on one device) and all-to-all, on the inputs the graded checks draw
(``tests/labs/test_lab9_*.py``: their configurations and seeded inputs are imported from
there, so both sides see the same numbers)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

from reference_impl.moe import moe_layer, router
from reference_impl.comm.expert_groups import experts_of_rank, expert_parallel_groups

GRADED = Path(__file__).resolve().parents[3] / "tests" / "labs"
SEEDS = (0, 1, 2)       # the public sweep's (0) and the hidden checks' (make_hidden)
LAUNCH_SEEDS = (0, 1)   # the same for the checks that launch ranks (fewer: each is a launch)


def graded(name: str):
    """The graded test module ``name`` (its configurations and input generators)."""
    if str(GRADED) not in sys.path:
        sys.path.insert(0, str(GRADED))
    return importlib.import_module(name)


def tie_free(probabilities: torch.Tensor, top_k: int, what: str) -> None:
    """A ValueError where a token's k-th and (k+1)-th probabilities are equal: the experts
    chosen would be a coin toss, and the checks compare them exactly."""
    k = min(top_k + 1, probabilities.shape[1])
    values = probabilities.topk(k, dim=-1).values
    if (values.diff(dim=-1) == 0).any():
        raise ValueError(f"{what}: a token's top-{top_k} probabilities tie; change the inputs")


def router_values(moe, seed: int) -> list[dict]:
    found = []
    for i, config in enumerate(moe.router_configs(seed)):
        values = moe.route(router, config, moe.config_seed(seed, i))
        tie_free(values["probabilities"], config["top_k"], f"router seed {seed} config {i}")
        found.append(values)
    return found


def layouts(moe, seed: int) -> dict:
    return {name: {kind: [list(g) for g in groups] for kind, groups in
                   expert_parallel_groups(dp_groups, ep).items()}
            for name, (dp_groups, ep) in moe.parallelisms(seed).items()}


def sync_values(moe, seed: int) -> dict:
    """Per layout, per rank: the gradients of the mean of the dp ranks' losses from the known
    gradients (dense: the DP group's sum; expert: the EDP group's; both divided by dp)."""
    found = {}
    for i, (name, groups) in enumerate(layouts(moe, seed).items()):
        given = [moe.sync_gradients(i, r, seed, 2) for r in range(moe.WORLD)]
        ranks = []
        for rank in range(moe.WORLD):
            mine = moe.groups_of_rank(groups, rank)
            dp = len(mine["DP"])
            ranks.append({kind: [sum(given[s][k][j] for s in mine[over]) / dp
                                 for j in range(len(given[rank][k]))]
                          for k, (kind, over) in enumerate((("dense", "DP"), ("expert", "EDP")))})
        found[name] = ranks
    return found


def dispatch_rows(x, routing, top_k):
    """The kept assignments' flat indices, stably sorted by expert; their rows; the same rows
    in token order."""
    kept = routing.kept.flatten().nonzero().squeeze(1)
    order = kept[routing.expert_index.flatten()[kept].argsort(stable=True)]
    return order, x[order // top_k], x[kept // top_k]


def combine_mistakes(layer, x, routing, order, top_k):
    """The outputs of the combine's known mistakes, from the rows the experts return."""
    token = order // top_k
    expert = routing.expert_index.flatten()[order]
    returned = torch.zeros_like(x[token])
    for e in expert.unique().tolist():
        rows = (expert == e).nonzero().squeeze(1)
        returned[rows] = layer.experts[e](x[token[rows]])
    weight = routing.weight.flatten()[order].unsqueeze(1)
    in_token_order = routing.weight.flatten()[routing.kept.flatten()].unsqueeze(1)
    zeros = torch.zeros_like(x)
    return {"unweighted": zeros.index_add(0, token, returned),
            "not un-permuted": zeros.index_add(0, token.sort().values, returned * weight),
            "weights in token order": zeros.index_add(0, token, returned * in_token_order)}


def rank_step(moe, config, params, x, upstream):
    """One rank's step on one device: its routing, output and every gradient."""
    layer = moe_layer.MoELayer(moe.HIDDEN, moe.FFN, config["experts"], config["top_k"],
                               config["capacity"], config["renormalize"])
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            parameter.copy_(params[name])
    x = x.clone().requires_grad_()
    result = layer(x)
    ((result.output * upstream).sum() + moe.AUX * result.aux_loss).backward()
    routing = result.routings[0]
    tie_free(routing.probabilities, config["top_k"], "a layer's routing")
    order, rows, unsorted = dispatch_rows(x.detach(), routing, config["top_k"])
    with torch.no_grad():
        mistakes = combine_mistakes(layer, x.detach(), routing, order, config["top_k"])
    rule = {"expert_index": routing.expert_index, "weight": routing.weight.detach(),
            "kept": routing.kept, "tokens_per_expert": routing.tokens_per_expert,
            "probabilities": routing.probabilities.detach(),
            "aux_loss": routing.aux_loss.detach(), "capacity": routing.capacity}
    return {"rule": rule, "output": result.output.detach(), "input_grad": x.grad,
            "rows": rows, "rows in token order": unsorted, "combine mistakes": mistakes,
            "grads": {name: p.grad.clone() for name, p in layer.named_parameters()}}


def flat(tensors) -> torch.Tensor:
    """Many small tensors as one (a snapshot stores each tensor with its own overhead)."""
    return torch.cat([t.detach().flatten() for t in tensors])


def layer_values(moe, seed: int) -> list:
    """Per configuration, [rank][step]: what the reference's layer gives on the rank."""
    found = []
    for index, config in enumerate(moe.layer_configs(seed)):
        dp_groups, ep = moe.parallelisms(seed)[config["parallelism"]]
        groups = {kind: [list(g) for g in found_groups] for kind, found_groups in
                  expert_parallel_groups(dp_groups, ep).items()}
        per = config["experts"] // ep
        truth = [[None] * moe.STEPS for _ in range(moe.WORLD)]
        for members in groups["DP"]:
            params = moe.layer_parameters(config, moe.config_seed(seed, index))
            for step in range(moe.STEPS):
                steps = {r: rank_step(moe, config, params, *moe.layer_tokens(
                    config, seed, index, r, step)) for r in members}
                mean = {n: sum(steps[r]["grads"][n] for r in members) / len(members)
                        for n in params}
                params = {n: params[n] - moe.LR * mean[n] for n in params}
                for rank in members:
                    mine = moe.groups_of_rank(groups, rank)
                    ep_index = mine["EP"].index(rank)
                    held = ["router.gate.weight"] + [
                        n for n in params for e in experts_of_rank(config["experts"], ep,
                                                                   ep_index)
                        if n.startswith(f"experts.{e}.")]
                    counts = [steps[s]["rule"]["tokens_per_expert"].tolist() for s in mine["EP"]]
                    by_rank = [[sum(c[d * per:(d + 1) * per]) for d in range(ep)] for c in counts]
                    mine_counts = torch.tensor([c[ep_index * per:(ep_index + 1) * per]
                                                for c in counts])
                    me = {k: v for k, v in steps[rank].items() if k != "grads"}
                    me.update(mine)
                    me.update({
                        "ep_index": ep_index, "counts_by_ep_rank": counts,
                        "sends": by_rank[ep_index], "receives": [row[ep_index] for row in by_rank],
                        "receives read transposed":
                            mine_counts.flatten().view(per, ep).t().sum(1).tolist(),
                        "held": held, "shapes": [list(params[n].shape) for n in held],
                        "before": flat([steps[rank]["grads"][n] if n.startswith("router.") else
                                        sum(steps[s]["grads"][n] for s in mine["EP"])
                                        for n in held]),
                        "after": flat([mean[n] for n in held])})
                    truth[rank][step] = me
        found.append(truth)
    return found


def groups_values(groups_test, seed: int) -> dict:
    return {f"{dp_groups}/{ep}": {kind: [list(g) for g in found] for kind, found in
                                  expert_parallel_groups(dp_groups, ep).items()}
            for _, dp_groups, ep in groups_test.cases(seed)}


def exchange_values(exchange_test, seed: int) -> list:
    """Per configuration, per rank: the rows it receives, as indices into every rank's rows
    concatenated in rank order, and its output splits."""
    found = []
    for config in exchange_test.exchange_configs(seed):
        groups = exchange_test.exchange_groups(config, seed)
        sends = exchange_test.exchange_sends(config, seed)
        totals = [sum(each) for each in sends]
        starts = [sum(totals[:r]) for r in range(len(sends))]
        ranks = []
        for rank in range(len(sends)):
            group = next(g for g in groups if rank in g)
            position = group.index(rank)
            index, receives = [], []
            for source in group:
                first = starts[source] + sum(sends[source][:position])
                index += range(first, first + sends[source][position])
                receives.append(sends[source][position])
            ranks.append({"index": torch.tensor(index, dtype=torch.long),
                          "receives": receives})
        found.append(ranks)
    return found


def make() -> dict:
    return values_of_seeds(SEEDS[:1], LAUNCH_SEEDS[:1])


def make_hidden() -> dict:
    return values_of_seeds(SEEDS[1:], LAUNCH_SEEDS[1:])


def values_of_seeds(seeds, launch_seeds) -> dict:
    """The reference's values on the sweeps of ``seeds`` (and, for the checks that launch
    ranks, ``launch_seeds``)."""
    torch.manual_seed(0)  # the layers' initial weights, overwritten: only for determinism
    moe = graded("test_lab9_moe")
    groups_test = graded("test_lab9_expert_groups")
    exchange_test = graded("test_lab9_token_exchange")
    found = {}
    for seed in seeds:
        found[f"router seed {seed}"] = router_values(moe, seed)
        found[f"groups seed {seed}"] = groups_values(groups_test, seed)
        found[f"exchange seed {seed}"] = exchange_values(exchange_test, seed)
    for seed in launch_seeds:
        found[f"layouts seed {seed}"] = layouts(moe, seed)
        found[f"sync seed {seed}"] = sync_values(moe, seed)
        found[f"layer seed {seed}"] = layer_values(moe, seed)
    return found
