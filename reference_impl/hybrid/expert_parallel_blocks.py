"""Expert parallelism in the trainer: each MoE block's experts split over EP groups cut from
the replicas (GShard, Lepikhin et al. 2020; Megatron-core's expert parallelism): the EP ranks
of a replica group hold E / ep experts each and exchange tokens with two all-to-alls
(``moe/expert_parallel.py``); dense gradients are averaged over the replicas, expert ones
over the ranks holding the same experts (EDP), both divided by dp (``sync_moe_grads``).
"""
from __future__ import annotations

from reference_impl.moe.expert_parallel import ExpertParallelMoE, is_expert_parameter
from reference_impl.moe.moe_blocks import MoEFeedForward


def apply_ep(model) -> None:
    """Each MoE block's layer to its expert-parallel version over the context's EP groups."""
    groups = model.context.experts
    if groups is None or not model.experts[0]:
        return
    before = dict(model.named_parameters())
    for stage in model.stages.values():
        for layer in stage.modules():
            if isinstance(layer, MoEFeedForward):
                layer.moe = ExpertParallelMoE(layer.moe, groups)
    model.remap_names(before)


def expert_gradients(gradients) -> tuple[list, list]:
    """(dense, expert) gradients of (parameter, gradient) pairs."""
    dense, expert = [], []
    for parameter, gradient in gradients:
        (expert if is_expert_parameter(parameter) else dense).append(gradient)
    return dense, expert
