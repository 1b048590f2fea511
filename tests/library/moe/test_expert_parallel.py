"""The expert-parallel MoE layer against the single-device MoE layer, on 4 ranks, in one launch:
ep = 4 (one EP group, EDP groups of 1), ep = 2 (two EP groups at once, EDP groups of 2), and
ep = 2 inside two strided data-parallel groups [0, 2] and [1, 3] (EP groups that are not
consecutive world ranks); E = 4 or 8 experts, k = 1 and 2, capacity dropping and dropless.

Every rank has its own tokens (7 per rank, or 7, 5, 7, 6: counts that divide nothing). Each
rank's router routes its own tokens with its own capacity (GShard's per-group capacity), so the
oracle is the single-device layer on the concatenation of the DP group's tokens routed with
``routing_groups`` = the ranks' token counts: the same routing and the same drops. Rank r's
loss is L_r = sum(y_r * g_r) + 0.1 aux_r; the oracle's is the mean over the DP group's ranks.
Compared: outputs, the routing (experts, kept), the aux loss, input gradients (rank r's, of its
own L_r, divided by dp: the oracle's are of the mean), every parameter gradient after
``sync_moe_grads``, and the weights after an SGD step. Also: the bytes each all-to-all sent
(the sum of its split sizes, as measured) against ``moe_costs.all_to_all_bytes``, and the load
per expert (what each EP rank's experts ran on) against the oracle's routing.

Tolerance (fp32): atol = rtol = 1e-5. Observed on CPU: within 1.2e-7 (the experts compute the
same products; the gradients' sums over tokens and over ranks add in another order). A sync that
divides the expert gradients by the EDP size instead of dp, or a dispatch that loses the token
order within an expert, fails every configuration.
"""
import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device, gpu_count
from reference_impl.comm.launcher import launch
from reference_impl.comm.expert_groups import ExpertGroups, create_expert_groups
from reference_impl.moe.expert_parallel import ExpertParallelMoE, sync_moe_grads
from reference_impl.moe.moe_costs import all_to_all_bytes, tokens_to_ranks
from reference_impl.moe.moe_layer import MoELayer
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
WORLD, HIDDEN, FFN = 4, 8, 16
AUX, LR = 0.1, 0.1
WORLD_DP = ((0, 1, 2, 3),)
STRIDED_DP = ((0, 2), (1, 3))
# name: (dp groups, ep, experts, top_k, capacity factor (None: dropless), renormalize, tokens per rank)
CONFIGS = {
    "ep4-E8-k2-drop": (WORLD_DP, 4, 8, 2, 0.75, True, (7, 7, 7, 7)),
    "ep4-E4-k1-dropless": (WORLD_DP, 4, 4, 1, None, False, (7, 5, 7, 6)),
    "ep2x2-E4-k2-dropless": (WORLD_DP, 2, 4, 2, None, True, (7, 7, 7, 7)),
    "ep2x2-E8-k1-drop": (WORLD_DP, 2, 8, 1, 1.0, False, (7, 5, 7, 6)),
    "ep2x2-E4-k2-drop": (WORLD_DP, 2, 4, 2, 0.75, True, (7, 7, 7, 7)),
    "ep2-strided-dp-E4-k2-drop": (STRIDED_DP, 2, 4, 2, 0.75, False, (7, 7, 7, 7)),
}


def tokens_of(rank, counts):
    return random((counts[rank], HIDDEN), seed=100 + rank), random((counts[rank], HIDDEN), seed=200 + rank)


def oracle(layer, members, counts):
    """The single-device layer on the DP group's tokens, each rank's routed as one group."""
    x = torch.cat([tokens_of(r, counts)[0] for r in members]).requires_grad_()
    upstream = torch.cat([tokens_of(r, counts)[1] for r in members])
    result = layer(x, routing_groups=[counts[r] for r in members])
    loss = (result.output * upstream).sum() / len(members) + AUX * result.aux_loss
    loss.backward()
    return x, result


def compare(name, groups: ExpertGroups, dp_groups):
    """(what, expert-parallel, single-device) triples and the exchange records of one config."""
    _, ep, experts, top_k, capacity_factor, renormalize, counts = CONFIGS[name]
    rank = dist.get_rank()
    members = next(sorted(group) for group in dp_groups if rank in group)
    torch.manual_seed(0)
    layer = MoELayer(HIDDEN, FFN, experts, top_k, capacity_factor, renormalize).to(current_device())
    parallel = ExpertParallelMoE(layer, groups)
    x_all, expected = oracle(layer, members, counts)

    x, upstream = tokens_of(rank, counts)
    x = x.clone().requires_grad_()
    result = parallel(x)
    ((result.output * upstream).sum() + AUX * result.aux_loss).backward()
    sync_moe_grads(parallel, groups)

    me = members.index(rank)
    start, stop = sum(counts[r] for r in members[:me]), sum(counts[r] for r in members[:me + 1])
    mine, theirs = result.routings[0], expected.routings[me]
    pairs = [("output", result.output, expected.output[start:stop]),
             ("expert index", mine.expert_index, theirs.expert_index),
             ("kept", mine.kept, theirs.kept),
             ("aux loss", result.aux_loss, theirs.aux_loss),
             ("input grad / dp", x.grad / len(members), x_all.grad[start:stop])]
    reference = dict(layer.named_parameters())
    for what, parameter in parallel.named_parameters():
        pairs.append((f"grad of {what}", parameter.grad, reference[what].grad))
    for module in (parallel, layer):
        torch.optim.SGD(module.parameters(), lr=LR).step()
    for what, parameter in parallel.named_parameters():
        pairs.append((f"{what} after a step", parameter, reference[what]))
    return {
        "pairs": [(what, a.detach().cpu(), b.detach().cpu()) for what, a, b in pairs],
        "exchanges": parallel.all_to_all_log,
        "tokens_per_expert": mine.tokens_per_expert.tolist(),
        "tokens_per_local_expert": parallel.tokens_per_local_expert,
        "local_experts": list(parallel.local_experts),
        "dropped": mine.dropped,
        "ep_members": members[me // ep * ep:(me // ep + 1) * ep],
    }


def every_config():
    groups_of = {}  # every rank creates the same groups in the same order
    results = {}
    for name, (dp_groups, ep, *_) in CONFIGS.items():
        if (dp_groups, ep) not in groups_of:
            groups_of[dp_groups, ep] = create_expert_groups(ep, dp_groups)
        results[name] = compare(name, groups_of[dp_groups, ep], dp_groups)
    return results


@pytest.fixture(scope="module")
def results(request):
    backend = request.config.getoption("--backend")
    if backend == "nccl" and gpu_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs for nccl, this machine has {gpu_count()}")
    return launch(every_config, WORLD, backend=backend, timeout=120)


@pytest.mark.parametrize("name", CONFIGS)
def test_expert_parallel_matches_the_single_device_layer(results, name):
    capacity_factor = CONFIGS[name][4]
    for rank, per_config in enumerate(results):
        for what, parallel, reference in per_config[name]["pairs"]:
            assert_close(parallel, reference, f"{name}: {what}", rank=rank, **TOLERANCE)
    dropped = sum(per_config[name]["dropped"] for per_config in results)
    if capacity_factor is None:
        assert dropped == 0, f"{name}: a dropless layer dropped {dropped} assignments"
    else:
        assert dropped > 0, f"{name}: nothing was dropped, so the capacity rule went untested"
    router_grad = next(reference for what, _, reference in results[0][name]["pairs"]
                       if what == "grad of router.gate.weight")
    assert router_grad.abs().max() > 1e-3, f"{name}: the router's gradient is ~0, a weak test"


@pytest.mark.parametrize("name", CONFIGS)
def test_all_to_all_bytes_are_the_formula_and_the_load_is_measured(results, name):
    """Measured: each recorded all-to-all's split sizes, as passed to all_to_all_single
    (forward and backward). Formula: ``all_to_all_bytes`` of the EP group's routing counts.
    The load each rank measures (rows its experts ran on) is what the EP group routed to them."""
    ep = CONFIGS[name][1]
    row_bytes = HIDDEN * 4
    uneven = False
    for rank, per_config in enumerate(results):
        found = per_config[name]
        group = [results[r][name] for r in found["ep_members"]]
        counts = [member["tokens_per_expert"] for member in group]
        formula = all_to_all_bytes(counts, found["ep_members"].index(rank), HIDDEN, 4)
        measured = {call.name: call for call in found["exchanges"]}
        assert sorted(measured) == ["combine backward", "combine forward", "dispatch backward",
                                    "dispatch forward"], f"{name}, rank {rank}: {sorted(measured)}"
        for call in measured.values():
            assert call.row_bytes == row_bytes
        expected = {"dispatch forward": formula.dispatch_forward,
                    "combine forward": formula.combine_forward,
                    "dispatch backward": formula.dispatch_backward,
                    "combine backward": formula.combine_backward}
        for what, nbytes in expected.items():
            assert measured[what].bytes_leaving == nbytes, (
                f"{name}, rank {rank}: {what} sent {measured[what].bytes_leaving} bytes, the "
                f"formula says {nbytes}")
        sent = tokens_to_ranks(found["tokens_per_expert"], ep)
        assert list(measured["dispatch forward"].send_splits) == sent, (name, rank)
        uneven |= len(set(sent)) > 1
        # The load: what this rank's experts ran on = the EP group's tokens routed to them.
        routed_here = [sum(member["tokens_per_expert"][e] for member in group)
                       for e in found["local_experts"]]
        assert found["tokens_per_local_expert"] == routed_here, (name, rank)
    assert uneven, f"{name}: every split was even, so uneven all_to_all_single went untested"
