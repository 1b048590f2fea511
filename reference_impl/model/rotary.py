"""Rotary position embeddings (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary
Position Embedding"), as Llama applies them to queries and keys.

Each pair of features (i, i + d/2) of a head is turned by the angle ``position * theta_i`` with
``theta_i = base^(-2i/d)``: the score q . k then depends on the two tokens' positions only
through their difference. Positions are passed in, not assumed to be 0..s-1, because a rank
that holds chunks of the sequence (context parallelism) rotates its tokens by their places in
the whole sequence.
"""
from __future__ import annotations

import torch

ROTARY_BASE = 10000.0


def rotary_angles(positions: torch.Tensor, head_dim: int, base: float = ROTARY_BASE) -> torch.Tensor:
    """(len(positions), head_dim / 2) angles ``position * base^(-2i/d)``, in fp32."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings turn pairs of features: head_dim {head_dim} is odd")
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    return positions.to(torch.float32)[:, None] * base ** -exponents[None, :]


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = ROTARY_BASE) -> torch.Tensor:
    """``x`` (batch, heads, seq, head_dim) with each token's features turned by its position
    (``positions``: seq integers). Computed in fp32, returned in ``x``'s dtype."""
    angles = rotary_angles(positions, x.shape[-1], base)
    cos, sin = angles.cos(), angles.sin()
    first, second = x.float().chunk(2, dim=-1)
    turned = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return turned.to(x.dtype)
