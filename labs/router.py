# Student file for the labs, generated from reference_impl/moe/router.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""The top-k router of a mixture-of-experts layer: which experts each token goes to, with which
weight, and which of those assignments an expert has room for (Shazeer et al. 2017, top-k
gating; GShard, Lepikhin et al. 2020, capacity; Switch Transformers, Fedus et al. 2021, k = 1
and the load-balancing loss). The rule, for tokens x (T, hidden) and E experts:

    probabilities = softmax(x W_gate^T), in fp32 (T, E); expert_index, p = its top-k (T, k)
    weight = p / sum_k p (renormalize=True, the default: GShard, Mixtral), or p (Switch)
    capacity = ceil(capacity_factor * T * k / E) per expert and router call; an expert keeps
        its first assignments in token order, drops the rest (capacity_factor=None: dropless)
    aux_loss = E * sum_e f_e * P_e (Switch, eq. 4): f_e the share of the T * k assignments to
        e before dropping (no gradient), P_e the mean of probabilities[:, e]; 1 when uniform

Lab 9's notebook, "2. The router: top-k and capacity" and "3. The load, with and without the
auxiliary loss"; GShard's drop order, k = 1: ``docs/library.md``, "Beyond the three dimensions".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Routing:
    """One router call's decisions for T tokens, k slots per token and E experts."""

    expert_index: torch.Tensor       # (T, k) long: the expert of each (token, slot)
    weight: torch.Tensor             # (T, k): its weight (differentiable, towards the gate)
    kept: torch.Tensor               # (T, k) bool: False where the expert was full (dropped)
    tokens_per_expert: torch.Tensor  # (E,) long: kept assignments per expert, what each computes
    probabilities: torch.Tensor      # (T, E): the softmax over experts
    aux_loss: torch.Tensor           # scalar: E * sum_e f_e P_e
    capacity: int | None             # per expert, None when dropless

    @property
    def dropped(self) -> int:
        """How many (token, slot) assignments were dropped."""
        return int((~self.kept).sum())


def check_router(hidden: int, num_experts: int, top_k: int, capacity_factor: float | None) -> None:
    """A ValueError naming the numbers for a router that cannot be built."""
    if hidden < 1 or num_experts < 1:
        raise ValueError(f"a router needs hidden >= 1 and at least one expert, got hidden = "
                         f"{hidden} and {num_experts} experts")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k = {top_k} must be between 1 and the number of experts "
                         f"({num_experts}): a token picks k different experts")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive (or None for dropless), got "
                         f"{capacity_factor}")


def expert_capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """ceil(capacity_factor * tokens * k / E) assignments per expert; None (no limit) when
    dropless."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def keep_within_capacity(expert_index: torch.Tensor, num_experts: int,
                         capacity: int | None) -> torch.Tensor:
    """(T, k) bool: True where the assignment is among the first ``capacity`` of its expert,
    counted in token order (slots of one token in slot order: they name different experts)."""
    if capacity is None:
        return torch.ones_like(expert_index, dtype=torch.bool)
    raise NotImplementedError('lab9: keep_within_capacity (hint: "top-k and capacity" in the notebook)')


def switch_aux_loss(probabilities: torch.Tensor, expert_index: torch.Tensor) -> torch.Tensor:
    """E * sum_e f_e P_e (Switch Transformers, eq. 4), f_e over all T * k assignments before
    any is dropped."""
    num_experts = probabilities.shape[1]
    routed = torch.bincount(expert_index.flatten(), minlength=num_experts)
    fraction = routed.to(probabilities.dtype) / expert_index.numel()   # f_e
    mean_probability = probabilities.mean(dim=0)                       # P_e
    return num_experts * (fraction * mean_probability).sum()


class Router(nn.Module):
    """A linear gate (no bias) and top-k routing with capacity; see the module docstring."""

    def __init__(self, hidden: int, num_experts: int, top_k: int = 2,
                 capacity_factor: float | None = None, renormalize: bool = True):
        super().__init__()
        check_router(hidden, num_experts, top_k, capacity_factor)
        self.num_experts, self.top_k = num_experts, top_k
        self.capacity_factor, self.renormalize = capacity_factor, renormalize
        self.gate = nn.Linear(hidden, num_experts, bias=False)

    def forward(self, tokens: torch.Tensor) -> Routing:
        """Route ``tokens`` of shape (T, hidden), all of them as one group (one capacity)."""
        raise NotImplementedError('lab9: Router.forward (hint: "top-k and capacity" in the notebook)')
        capacity = expert_capacity(tokens.shape[0], self.num_experts, self.top_k,
                                   self.capacity_factor)
        kept = keep_within_capacity(expert_index, self.num_experts, capacity)
        tokens_per_expert = torch.bincount(expert_index[kept], minlength=self.num_experts)
        return Routing(expert_index=expert_index, weight=weight.to(tokens.dtype), kept=kept,
                       tokens_per_expert=tokens_per_expert, probabilities=probabilities,
                       aux_loss=switch_aux_loss(probabilities, expert_index), capacity=capacity)
