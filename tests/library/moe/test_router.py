"""The top-k router and the single-device MoE layer: hand-made cases where the chosen experts,
their weights and the dropped assignments are known; the capacity formula; dropless routing;
the Switch auxiliary loss against its formula written out here; the layer against a loop over
tokens and slots; and the errors.

Tolerance (fp32): atol = rtol = 1e-6 (observed: the routing exact, the weights within 1e-7,
the layer's outputs within 1.2e-7 of the loop, which adds the same products in another order).
"""
import math

import pytest
import torch

from reference_impl.checks import assert_close
from reference_impl.moe.moe_layer import MoELayer
from reference_impl.moe.router import Router, expert_capacity
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-6, rtol=1e-6)
# Logits written directly (the gate is the identity, hidden = E = 4): each row's two largest
# logits are the token's two experts, first choice first.
LOGITS = torch.tensor([[3.0, 2.0, 0.0, 0.0],    # token 0: experts 0, 1
                       [2.0, 3.0, 0.0, 0.0],    # token 1: experts 1, 0
                       [2.0, 0.0, 3.0, 0.0],    # token 2: experts 2, 0
                       [0.0, 0.0, 2.0, 3.0]])   # token 3: experts 3, 2


def identity_router(top_k, capacity_factor=None, renormalize=True):
    router = Router(4, 4, top_k, capacity_factor, renormalize)
    with torch.no_grad():
        router.gate.weight.copy_(torch.eye(4))
    return router


def test_top_2_experts_and_their_renormalised_weights():
    routing = identity_router(top_k=2)(LOGITS)
    assert routing.expert_index.tolist() == [[0, 1], [1, 0], [2, 0], [3, 2]]
    # softmax then renormalised over the two: e^3 / (e^3 + e^2) = sigmoid(1) for the first
    first = 1 / (1 + math.exp(-1))
    assert_close(routing.weight, torch.tensor([[first, 1 - first]] * 4), "renormalised weights",
                 **TOLERANCE)
    assert routing.kept.all() and routing.capacity is None and routing.dropped == 0
    assert routing.tokens_per_expert.tolist() == [3, 2, 2, 1]   # dropless: every assignment


def test_without_renormalising_the_weights_are_the_probabilities():
    routing = identity_router(top_k=1, renormalize=False)(LOGITS)
    assert routing.expert_index.flatten().tolist() == [0, 1, 2, 3]
    probabilities = LOGITS.softmax(dim=-1)
    assert_close(routing.weight.flatten(), probabilities.max(dim=-1).values,
                 "top-1 weight = the largest probability (Switch)", **TOLERANCE)
    renormalised = identity_router(top_k=1)(LOGITS)
    assert torch.equal(renormalised.weight, torch.ones(4, 1)), "renormalised over k = 1: all 1"


def test_capacity_drops_the_assignments_past_it_in_token_order():
    # capacity = ceil(0.5 * 4 tokens * 2 / 4 experts) = 1 assignment per expert.
    routing = identity_router(top_k=2, capacity_factor=0.5)(LOGITS)
    assert routing.capacity == 1
    # Expert 0's queue: token 0 (slot 0), token 1 (slot 1), token 2 (slot 1): keeps token 0's.
    # Expert 1's: token 0 (slot 1), token 1 (slot 0): keeps token 0's, so token 1 loses its
    # *first* choice to token 0's second (token order; GShard would serve first choices first).
    # Expert 2's: token 2 (slot 0), token 3 (slot 1). Expert 3's: token 3 (slot 0).
    assert routing.kept.tolist() == [[True, True], [False, False], [True, False], [True, False]]
    assert routing.tokens_per_expert.tolist() == [1, 1, 1, 1]
    assert routing.dropped == 4   # of the 8 assignments


def test_top_1_capacity_drops_later_tokens_of_a_full_expert():
    logits = torch.eye(4)[[0, 0, 1, 0, 0, 2]] * 5   # first choices 0, 0, 1, 0, 0, 2
    routing = identity_router(top_k=1, capacity_factor=1.0)(logits)
    assert routing.capacity == 2   # ceil(1.0 * 6 * 1 / 4)
    assert routing.kept.flatten().tolist() == [True, True, True, False, False, True]
    assert routing.tokens_per_expert.tolist() == [2, 1, 1, 0]


def test_capacity_formula():
    assert expert_capacity(7, 4, 2, 1.25) == 5            # ceil(4.375)
    assert expert_capacity(8, 4, 2, 1.0) == 4             # exact
    assert expert_capacity(7, 8, 1, 1.0) == 1             # ceil(0.875)
    assert expert_capacity(7, 4, 2, None) is None         # dropless


@pytest.mark.parametrize("top_k", [1, 2])
def test_aux_loss_is_switch_formula(top_k):
    x = random((9, 4), seed=3)
    routing = identity_router(top_k, capacity_factor=0.5)(x)
    probabilities = x.softmax(dim=-1)
    experts = probabilities.topk(top_k, dim=-1).indices
    # E * sum_e f_e P_e; f_e counts every assignment, dropped or not, over T * k
    f = torch.stack([(experts == e).sum() for e in range(4)]).float() / (9 * top_k)
    P = probabilities.mean(dim=0)
    assert_close(routing.aux_loss, 4 * (f * P).sum(), f"aux loss at k = {top_k}", **TOLERANCE)
    assert routing.dropped > 0, "the aux loss must count the dropped assignments too"
    uniform = identity_router(top_k)(torch.zeros(5, 4))
    assert_close(uniform.aux_loss, torch.tensor(1.0), "aux loss of uniform probabilities",
                 **TOLERANCE)


@pytest.mark.parametrize("top_k, capacity_factor", [(1, 1.0), (2, 0.75), (2, None)])
def test_moe_layer_is_the_sum_over_kept_slots(top_k, capacity_factor):
    torch.manual_seed(0)
    layer = MoELayer(8, 16, num_experts=4, top_k=top_k, capacity_factor=capacity_factor)
    x = random((2, 7, 8), seed=4)   # 14 tokens, routed as groups of 9 and 5
    output, aux_loss, routings = layer(x, routing_groups=[9, 5])
    tokens, expected = x.reshape(14, 8), torch.zeros(14, 8)
    expert_index = torch.cat([r.expert_index for r in routings])
    weight = torch.cat([r.weight for r in routings])
    kept = torch.cat([r.kept for r in routings])
    for t in range(14):
        for s in range(top_k):
            if kept[t, s]:
                expected[t] += weight[t, s] * layer.experts[int(expert_index[t, s])](tokens[t])
    assert_close(output, expected.view(2, 7, 8), "MoE output", **TOLERANCE)
    assert [r.capacity for r in routings] == [expert_capacity(n, 4, top_k, capacity_factor)
                                             for n in (9, 5)]
    separately = [layer.router(tokens[:9]), layer.router(tokens[9:])]
    assert_close(aux_loss, (separately[0].aux_loss + separately[1].aux_loss) / 2,
                 "aux loss: the mean over routing groups", **TOLERANCE)
    if capacity_factor is not None and capacity_factor < 1:
        assert sum(r.dropped for r in routings) > 0, "expected dropped assignments"


def test_bad_routers_name_the_numbers():
    with pytest.raises(ValueError, match=r"top_k = 5 must be between 1 and the number of experts \(4\)"):
        Router(8, 4, top_k=5)
    with pytest.raises(ValueError, match=r"top_k = 3 .* \(2\)"):
        MoELayer(8, 16, num_experts=2, top_k=3)
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        Router(8, 4, top_k=1, capacity_factor=0)
    with pytest.raises(ValueError, match=r"routing groups of \[3, 3\] tokens do not split the 7"):
        MoELayer(8, 16, 4)(torch.zeros(7, 8), routing_groups=[3, 3])
