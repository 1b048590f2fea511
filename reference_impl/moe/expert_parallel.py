"""The expert-parallel MoE layer (GShard, Lepikhin et al. 2020; Switch Transformers; Megatron-core's
token dispatcher): the experts split over the ranks of an EP group, the tokens sent to their
experts and back with two all-to-alls.

Built shard-from-full from a single-device :class:`~reference_impl.moe.moe_layer.MoELayer`: the
router replicated, each rank's experts copied under their single-device names
(``experts.5.fc1.weight`` is expert 5 on whichever rank holds it). Each rank routes its own
tokens (its own capacity and auxiliary loss), permutes the kept assignments by expert,
exchanges the counts, dispatches the rows (``token_exchange.all_to_all_rows``), runs its
experts, combines the rows back and un-permutes them, weighted. The calls are recorded in
``all_to_all_log``; ``moe_costs.py`` has their bytes.

The steps: lab 9's notebook, "6. Dispatch and combine"; the backward's agreement rule and the
oracle: ``docs/library.md``, "Beyond the three dimensions" (expert parallelism).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.comm.mean_all_reduce import all_reduce_mean
from reference_impl.comm.expert_groups import ExpertGroups, experts_of_rank
from reference_impl.moe.moe_layer import MoELayer, MoEOutput
from reference_impl.moe.router import Router
from reference_impl.moe.token_exchange import all_to_all_rows


class ExpertParallelMoE(nn.Module):
    """This rank's part of ``layer``: the router and E/ep experts; input and output are this
    rank's own tokens (..., hidden). After the backward, call :func:`sync_moe_grads`."""

    def __init__(self, layer: MoELayer, groups: ExpertGroups):
        super().__init__()
        self.hidden, self.groups = layer.hidden, groups
        self.num_experts = layer.num_experts
        self.local_experts = experts_of_rank(layer.num_experts, groups.ep_size, groups.ep_rank)
        gate = layer.router  # rebuilt as this module's Router: the lab's own router runs here
        self.router = Router(layer.hidden, gate.num_experts, gate.top_k, gate.capacity_factor,
                             gate.renormalize).to(gate.gate.weight)
        self.router.load_state_dict(gate.state_dict())
        self.experts = nn.ModuleDict({str(e): copy.deepcopy(layer.experts[e])
                                      for e in self.local_experts})
        for parameter in self.experts.parameters():
            parameter.expert_parallel = True  # synced over the EDP group (sync_moe_grads)
        self.all_to_all_log: list = []          # this forward's and backward's exchanges
        self.tokens_per_local_expert: list[int] = []  # rows each local expert ran on, last forward

    def forward(self, x: torch.Tensor) -> MoEOutput:
        tokens = x.reshape(-1, self.hidden)
        routing = self.router(tokens)
        ep, group = self.groups.ep_size, self.groups.ep
        self.all_to_all_log = log = []

        # BEGIN SOLUTION lab9: the dispatch (hint: "dispatch and combine" in the notebook)
        # 2. permute: kept assignments (token-major), stably sorted by expert
        top_k = routing.expert_index.shape[1]
        assignment = routing.kept.flatten().nonzero().squeeze(1)
        assignment = assignment[routing.expert_index.flatten()[assignment].argsort(stable=True)]
        token = assignment // top_k
        permuted = tokens.index_select(0, token)

        # 3. counts: recv_counts[s, j] = rows rank s sends to local expert j
        recv_counts = torch.empty_like(routing.tokens_per_expert)
        dist.all_to_all_single(recv_counts, routing.tokens_per_expert, group=group)
        recv_counts = recv_counts.view(ep, len(self.local_experts))
        send_splits = routing.tokens_per_expert.view(ep, -1).sum(dim=1).tolist()
        recv_splits = recv_counts.sum(dim=1).tolist()

        # 4. dispatch
        received = all_to_all_rows(permuted, send_splits, recv_splits, group, "dispatch", log)
        # END SOLUTION

        # 5. local experts: the received rows come by source rank, within it by local expert
        local_expert_of_row = torch.arange(len(self.local_experts), device=tokens.device) \
            .repeat(ep).repeat_interleave(recv_counts.flatten())
        computed = torch.zeros_like(received)
        for j, expert in enumerate(self.experts.values()):
            rows = (local_expert_of_row == j).nonzero().squeeze(1)
            computed = computed.index_add(0, rows, expert(received.index_select(0, rows)))
        self.tokens_per_local_expert = recv_counts.sum(dim=0).tolist()

        # BEGIN SOLUTION lab9: the combine (hint: "dispatch and combine" in the notebook)
        # 6. combine
        returned = all_to_all_rows(computed, recv_splits, send_splits, group, "combine", log)

        # 7. un-permute and weight
        weight = routing.weight.flatten()[assignment].unsqueeze(1)
        y = torch.zeros_like(tokens).index_add(0, token, returned * weight)
        # END SOLUTION
        return MoEOutput(y.view_as(x), routing.aux_loss, (routing,))


def is_expert_parameter(parameter: nn.Parameter) -> bool:
    return getattr(parameter, "expert_parallel", False)


def sync_moe_grads(module: nn.Module, groups: ExpertGroups) -> None:
    """Make every gradient that of the mean of the dp ranks' losses, L = (1/dp) sum_r L_r,
    on every copy of every parameter.

    After the backward a **dense** parameter (the router, anything replicated; not marked)
    holds its own rank's tokens' gradient, and an **expert** parameter (marked
    ``expert_parallel``) the gradient of the tokens the dispatch brought it. Which ranks'
    copies to sum, and by what to divide, follows from that: the notebook's section 6
    derives it (Megatron-core's DDP does the same for its experts).

    One all-reduce per group (``comm.mean_all_reduce.all_reduce_mean``). Collective
    over the groups it uses; call after the backward, before the optimizer step."""
    expert, dense = [], []
    for parameter in module.parameters():
        if parameter.grad is None:  # a rank whose tokens missed it: its share is 0
            parameter.grad = torch.zeros_like(parameter)
        (expert if is_expert_parameter(parameter) else dense).append(parameter.grad)
    # BEGIN SOLUTION lab9: sync_moe_grads (hint: "the MoE gradient sync" in the notebook)
    all_reduce_mean(dense, groups.dp, groups.dp_size)
    all_reduce_mean(expert, groups.edp, groups.dp_size)
    # END SOLUTION
