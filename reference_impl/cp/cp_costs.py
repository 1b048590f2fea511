"""What context parallelism costs per rank and attention layer: bytes sent, bytes kept.

Bytes each rank sends in ring attention and in the all-gather variant, forward and backward
(Liu et al. 2023, "Ring Attention"; Dubey et al. 2024, "The Llama 3 Herd of Models", section
3.3.2), and the activation memory one attention layer keeps per rank. The formulas:
docs/library.md, 'Beyond the three dimensions'.
"""
from __future__ import annotations

from reference_impl.cp.load_balance import check_sequence

VARIANTS = ("ring", "allgather")
LSE_BYTES = 4  # the log-sum-exp per query row is fp32


def kv_block_bytes(batch: int, kv_heads: int, seq: int, head_dim: int, cp: int,
                   element_bytes: int = 4) -> int:
    """B_kv: the bytes of one rank's K and V (kv_heads only)."""
    check_sequence(seq, cp)
    return 2 * batch * kv_heads * (seq // cp) * head_dim * element_bytes


def ring_attention_bytes(batch: int, kv_heads: int, seq: int, head_dim: int, cp: int,
                         element_bytes: int = 4, grad_element_bytes: int = 4) -> dict[str, int]:
    """{"forward", "backward"}: bytes one rank sends in ring attention (docs/library.md)."""
    block = kv_block_bytes(batch, kv_heads, seq, head_dim, cp, element_bytes)
    grad_block = block // element_bytes * grad_element_bytes
    return {"forward": (cp - 1) * block, "backward": (cp - 1) * (block + grad_block)}


def allgather_attention_bytes(batch: int, kv_heads: int, seq: int, head_dim: int, cp: int,
                              element_bytes: int = 4, grad_element_bytes: int = 4) -> dict[str, int]:
    """{"forward", "backward"}: bytes one rank sends in the all-gather variant, the collectives
    run as rings ((cp-1)/cp of the gathered K/V, or of the dK/dV reduce-scattered)."""
    block = kv_block_bytes(batch, kv_heads, seq, head_dim, cp, element_bytes)
    return {"forward": (cp - 1) * block,
            "backward": (cp - 1) * block // element_bytes * grad_element_bytes}


def attention_activation_bytes(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int,
                               cp: int, element_bytes: int = 4, variant: str = "ring") -> int:
    """Bytes one rank's attention keeps for the backward (docs/library.md); cp = 1 is one
    device's."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}")
    check_sequence(seq, cp)
    local = seq // cp
    queries = local * batch * heads * (2 * head_dim * element_bytes + LSE_BYTES)  # q, out, lse
    kv_tokens = local if variant == "ring" else seq
    return queries + kv_tokens * batch * 2 * kv_heads * head_dim * element_bytes
