"""Expert parallelism in the trainer: each MoE block's experts split over EP groups cut from
the replicas (GShard, Lepikhin et al. 2020; Megatron-core's expert parallelism): the EP ranks
of a replica group hold E / ep experts each and exchange tokens with two all-to-alls
(``moe/expert_parallel.py``); dense gradients are averaged over the replicas, expert ones
over the ranks holding the same experts (EDP), both divided by dp (``sync_moe_grads``).
"""
from __future__ import annotations

from reference_impl.moe.expert_groups import create_expert_groups
from reference_impl.moe.expert_parallel import ExpertParallelMoE, is_expert_parameter
from reference_impl.moe.expert_split import check_expert_split
from reference_impl.moe.moe_blocks import MoEFeedForward


def experts_of(module) -> tuple[int, int]:
    """(experts, top_k) of the model's MoE blocks; (0, 0) for a dense model."""
    for layer in module.modules():
        if isinstance(layer, MoEFeedForward):
            return layer.moe.num_experts, layer.moe.router.top_k
    return 0, 0


def check_expert_layout(experts: int, dims) -> None:
    """What composes with a mixture of ``experts`` under ``dims``, each rule with its numbers
    (``experts`` = 0: a dense model)."""
    ep = dims.ep
    check_expert_split(experts, ep, dims.dp)
    if not experts:
        return
    for name, size in (("tp", dims.tp), ("cp", dims.cp)):
        if size > 1:
            raise ValueError(f"experts with {name} = {size}: the kit's MoE blocks are neither "
                             f"tensor- nor context-parallel; use {name} = 1 (experts compose "
                             f"with dp, ep and pp)")
    if ep == 1:
        return
    if dims.dp_kind != "sync":
        raise ValueError(f"ep = {ep} with dp_kind {dims.dp_kind}: the ranks of an EP group "
                         f"hold different experts, which only dp_kind sync reduces apart from "
                         f"the dense parameters; use dp_kind sync")
    if dims.recompute != "none":
        raise ValueError(f"ep = {ep} with recompute {dims.recompute}: recomputing a block "
                         f"would run its all-to-alls again in the backward; use recompute none")


def apply_ep(model, ep: int) -> None:
    """Each MoE block's layer to its expert-parallel version over EP groups cut from every
    RDP group (collective: every rank creates every group)."""
    if ep == 1 or not experts_of(model.stages)[0]:
        return
    groups = create_expert_groups(ep, model.context.layout.groups["RDP"])
    before = dict(model.named_parameters())
    for stage in model.stages.values():
        for layer in stage.modules():
            if isinstance(layer, MoEFeedForward):
                layer.moe = ExpertParallelMoE(layer.moe, groups)
    model.remap_names(before)
    model.expert_groups = groups


def expert_gradients(gradients) -> tuple[list, list]:
    """(dense, expert) gradients of (parameter, gradient) pairs."""
    dense, expert = [], []
    for parameter, gradient in gradients:
        (expert if is_expert_parameter(parameter) else dense).append(gradient)
    return dense, expert
