"""Data-parallel and FSDP collectives over the nodes of a cluster: where the ranks of a group
sit, what each node's NICs give each of them, ring or tree over the nodes, and the buckets the
frameworks send the gradients in.

Two levels (NVLink inside a node, each GPU's share of the NICs across nodes); the ring is lab
0's alpha-beta cost (``alpha_beta.ring_all_reduce_seconds``), the tree NCCL's double binary tree
(Sanders, Speck and Träff 2009). The formulas and the frameworks' bucket sizes:
docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

import math

from reference_impl.comm.alpha_beta import ring_all_reduce_seconds as ring
from reference_impl.perf.planner.hardware import GB, Cluster

MEGATRON_BUCKET_PARAMETERS = 40_000_000
MEGATRON_BUCKET_PARAMETERS_PER_DP_RANK = 1_000_000
DEEPSPEED_BUCKET_ELEMENTS = 5e8


def tree(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """A double binary tree all-reduce: 2 ceil(log2 n) alpha + 2 S/B."""
    return 2 * math.ceil(math.log2(n)) * alpha + 2 * nbytes / bandwidth


def ranks_per_node(cluster: Cluster, n: int, stride: int) -> int:
    """Ranks of an ``n``-rank group, ``stride`` GPUs apart, that share a node."""
    return max(1, min(n, cluster.gpus_per_node // stride))


def ring_seconds(nbytes: float, n: int, link: tuple[float, float], all_reduce: bool = True) -> float:
    """A ring all-reduce (or, half of it, a reduce-scatter or all-gather) over ``n`` ranks on one
    kind of link (alpha, bytes/s)."""
    if n == 1 or nbytes == 0:
        return 0.0
    seconds = ring(nbytes, n, *link)
    return seconds if all_reduce else seconds / 2


def across_nodes_seconds(nbytes: float, nodes: int, alpha: float, bandwidth: float) -> float:
    """All-reduce of ``nbytes`` across ``nodes``, one rank each: the faster of ring and tree."""
    if nodes == 1 or nbytes == 0:
        return 0.0
    return min(ring(nbytes, nodes, alpha, bandwidth), tree(nbytes, nodes, alpha, bandwidth))


def collective_seconds(nbytes: float, n: int, stride: int, cluster: Cluster,
                       all_reduce: bool = True) -> float:
    """One collective of ``nbytes`` (the full tensor) over a group of ``n`` ranks ``stride``
    GPUs apart (docs/library.md)."""
    if n == 1 or nbytes == 0:
        return 0.0
    k = ranks_per_node(cluster, n, stride)
    nodes = math.ceil(n / k)
    inside = ring_seconds(nbytes, k, (cluster.intra_alpha, cluster.intra_bw_gbs * GB))
    across = across_nodes_seconds(nbytes / k, nodes, cluster.inter_alpha,
                                  cluster.inter_bw_gbs * GB)
    seconds = inside + across
    return seconds if all_reduce else seconds / 2


def bucket_parameters(params: float, dp: int, accounting: str, layers: int) -> float:
    """Parameters per gradient bucket as each framework sends them (docs/library.md)."""
    if accounting == "fsdp":
        return params / max(1, layers)
    if accounting == "deepspeed":
        return DEEPSPEED_BUCKET_ELEMENTS
    return max(MEGATRON_BUCKET_PARAMETERS, MEGATRON_BUCKET_PARAMETERS_PER_DP_RANK * dp)


def bucketed_seconds(nbytes: float, buckets: int, n: int, stride: int, cluster: Cluster,
                     all_reduce: bool) -> tuple[float, float]:
    """(all the buckets, the last one): ``nbytes`` sent as ``buckets`` equal collectives."""
    if nbytes == 0 or n == 1:
        return 0.0, 0.0
    one = collective_seconds(nbytes / buckets, n, stride, cluster, all_reduce)
    return buckets * one, one
