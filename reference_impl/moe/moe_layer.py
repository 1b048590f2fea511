"""The single-device mixture-of-experts layer: the oracle of expert parallelism.

A router (``router.py``) and E expert MLPs in place of a block's MLP (Shazeer et al. 2017;
GShard; Switch Transformers): y_t = sum over the kept slots s of w_ts expert_{e_ts}(x_t), 0 for
a token whose slots were all dropped. One expert at a time (``index_select``, ``index_add``);
``routing_groups`` routes runs of tokens as the dp ranks of an expert-parallel layer would.
Details: docs/library.md, 'Beyond the three dimensions'.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from reference_impl.model import MLP
from reference_impl.moe.router import Router, Routing


class MoEOutput(NamedTuple):
    output: torch.Tensor            # the input's shape
    aux_loss: torch.Tensor          # the mean over routing groups of each group's Switch loss
    routings: tuple[Routing, ...]   # one per routing group, in token order


def split_tokens(tokens: torch.Tensor, routing_groups: Sequence[int] | None) -> tuple[torch.Tensor, ...]:
    """``tokens`` (T, hidden) cut into consecutive groups of the given sizes (one group when
    None); a ValueError unless the sizes add up to T."""
    if routing_groups is None:
        return (tokens,)
    if sum(routing_groups) != tokens.shape[0] or min(routing_groups, default=0) < 0:
        raise ValueError(f"routing groups of {list(routing_groups)} tokens do not split the "
                         f"{tokens.shape[0]} tokens")
    return tokens.split(list(routing_groups))


class MoELayer(nn.Module):
    """Router + ``num_experts`` expert MLPs (hidden -> ffn_hidden -> hidden, GeLU)."""

    def __init__(self, hidden: int, ffn_hidden: int, num_experts: int, top_k: int = 2,
                 capacity_factor: float | None = None, renormalize: bool = True):
        super().__init__()
        self.hidden, self.ffn_hidden = hidden, ffn_hidden
        self.router = Router(hidden, num_experts, top_k, capacity_factor, renormalize)
        self.experts = nn.ModuleList(MLP(hidden, ffn_hidden) for _ in range(num_experts))

    @property
    def num_experts(self) -> int:
        return self.router.num_experts

    def forward(self, x: torch.Tensor, routing_groups: Sequence[int] | None = None) -> MoEOutput:
        """``x`` of shape (..., hidden), its tokens in the order they are routed."""
        tokens = x.reshape(-1, self.hidden)
        routings = tuple(self.router(group) for group in split_tokens(tokens, routing_groups))
        expert_index = torch.cat([routing.expert_index for routing in routings])
        weight = torch.cat([routing.weight for routing in routings])
        kept = torch.cat([routing.kept for routing in routings])
        y = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            # An expert with no tokens still runs (on 0 rows): its gradients are then zeros,
            # not None, as on every rank of expert parallelism.
            token, slot = ((expert_index == e) & kept).nonzero(as_tuple=True)
            out = expert(tokens.index_select(0, token)) * weight[token, slot].unsqueeze(1)
            y = y.index_add(0, token, out)
        aux_loss = torch.stack([routing.aux_loss for routing in routings]).mean()
        return MoEOutput(y.view_as(x), aux_loss, routings)
