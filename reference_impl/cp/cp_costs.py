"""What context parallelism costs per rank and attention layer: bytes sent, bytes kept.

Sizes: batch b, query heads h, KV heads g (grouped-query attention), sequence s (whole),
head_dim d, cp ranks, so each rank holds s/cp tokens; e bytes per element of q, k, v and the
output; dK/dV travel in fp32 (the accumulation dtype, ``e_grad`` = 4). One K/V block is

    B_kv = 2 * b * g * (s/cp) * d * e

**Bytes each rank sends** (Liu et al. 2023, "Ring Attention"; Dubey et al. 2024, "The Llama 3
Herd of Models", section 3.3.2):

    ring, forward:         (cp - 1) * B_kv                     its K/V blocks, cp - 1 hops
    ring, backward:        (cp - 1) * B_kv * (1 + e_grad / e)  the blocks again, and their dK/dV
    all-gather, forward:   (cp - 1) * B_kv                     a ring all-gather: (cp-1)/cp of cp * B_kv
    all-gather, backward:  (cp - 1) * B_kv * e_grad / e        the reduce-scatter of dK/dV

**Activation memory** of one attention layer per rank: what the attention keeps for its
backward, q and out (b h (s/cp) d e each), K and V (the local block for the ring, the whole
gathered sequence for the all-gather variant) and one fp32 log-sum-exp per query row:

    ring:        (s/cp) * b * (2 h d e + 2 g d e + 4 h)             = 1/cp of cp = 1's
    all-gather:  (s/cp) * b * (2 h d e + 4 h) + s * b * 2 g d e
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
    """{"forward", "backward"}: bytes one rank sends in ring attention (module docstring)."""
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
    """Bytes one rank's attention keeps for the backward (module docstring); cp = 1 is one
    device's."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}")
    check_sequence(seq, cp)
    local = seq // cp
    queries = local * batch * heads * (2 * head_dim * element_bytes + LSE_BYTES)  # q, out, lse
    kv_tokens = local if variant == "ring" else seq
    return queries + kv_tokens * batch * 2 * kv_heads * head_dim * element_bytes
