"""Mixture-of-experts blocks for the trainer's model: each block's feed-forward a
``MoELayer`` (router + E expert MLPs), so that the model the trainer trains has experts to
split (``hybrid/expert_parallel_blocks.py``). The auxiliary load-balancing loss is kept on the
layer (``aux_loss``), not added to the training loss; with no capacity limit every token
reaches its top-k experts, so the model computes the same function on one device or many.
"""
from __future__ import annotations

import torch
from torch import nn

from reference_impl.model import GPT
from reference_impl.moe.moe_layer import MoELayer


class MoEFeedForward(nn.Module):
    """A block's MLP replaced by ``moe`` (a ``MoELayer`` or its expert-parallel version):
    returns the layer's output and keeps its auxiliary loss."""

    def __init__(self, moe: nn.Module):
        super().__init__()
        self.moe = moe
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.moe(x)
        self.aux_loss = result.aux_loss
        return result.output


def with_experts(gpt: GPT, experts: int, top_k: int) -> GPT:
    """``gpt`` with every block's MLP a mixture of ``experts`` GeLU MLPs of the block's inner
    size, ``top_k`` of them per token (the model's RNG stream: the same on every rank)."""
    config = gpt.config
    for block in gpt.blocks:
        block.mlp = MoEFeedForward(MoELayer(config.hidden, config.ffn_size, experts, top_k))
    return gpt.to(next(gpt.parameters()).device)


def experts_of(module: nn.Module) -> tuple[int, int]:
    """(experts, top_k) of the model's MoE blocks; (0, 0) for a dense model."""
    for layer in module.modules():
        if isinstance(layer, MoEFeedForward):
            return layer.moe.num_experts, layer.moe.router.top_k
    return 0, 0
