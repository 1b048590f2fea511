"""The tensor-parallel Llama parts (``tp/llama_tp.py``) against the single-device parts they were
built from: the SwiGLU MLP, grouped-query attention with its KV heads split (kv_heads 4 over
tp 2 and 4) and replicated (kv_heads 2 over tp 4, kv_heads 1 over tp 2), the whole Llama
block, and the sequence-parallel Llama block (also with the GPT's attention or MLP in place of
the Llama one). For each: the output, the input's gradient,
every parameter's gradient (gathered to its single-device shape by ``full_state``) and every
parameter after an SGD step (``equivalence.py``), on every rank; and the single-device module
it was built from left untouched. tp 2 runs on two groups of 2 of the 4 ranks ([0, 1] and
[2, 3]), tp 4 on the world, all in one launch of 4 ranks.

Tolerance (fp32): atol = rtol = 1e-5. Observed on CPU (torch 2.13): within 2.9e-6 (the
largest over ranks and checks is printed with ``-s``; matmuls and the gradients' all-reduces
add in another order than one device).
"""
import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device
from reference_impl.equivalence import assert_equivalent, one_step_pairs, parameters_of, source_pairs
from reference_impl.model.llama_blocks import GroupedQueryAttention, SwiGLU
from reference_impl.model import Block, llama_config
from reference_impl.tp.llama_tp import ParallelGroupedQueryAttention, ParallelSwiGLU, ReplicatedHeads
from reference_impl.tp.parallel_blocks import ParallelPartsBlock
from reference_impl.tp.sequence_parallel import sync_sequence_parallel_grads
from reference_impl.tp.tp_collectives import all_gather_along
from reference_impl.tp.tp_layers import full_state
from reference_impl.toys import random

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
WORLD, PAIRS = 4, [[0, 1], [2, 3]]
BATCH, SEQ, HIDDEN, HEADS = 2, 8, 32, 8
SHAPE = (BATCH, SEQ, HIDDEN)
LR = 0.1


def build(kind: str, kv_heads: int = 4) -> torch.nn.Module:
    """A single-device part, the same on every rank (seeded), on this rank's device."""
    torch.manual_seed(0)
    if kind == "swiglu":
        module = SwiGLU(HIDDEN, 96)
    elif kind == "attention":
        module = GroupedQueryAttention(HIDDEN, HEADS, kv_heads)
    else:  # a Llama block, or one with a GPT part in place of a Llama part
        mixed = {"block": {}, "block with gpt attention": dict(positions="learned", kv_heads=None),
                 "block with gelu mlp": dict(mlp="gelu")}[kind]
        module = Block(llama_config(hidden=HIDDEN, heads=HEADS, seq_len=SEQ,
                                    **{"kv_heads": kv_heads, **mixed}))
    with torch.no_grad():  # norms away from 1, so that their gradients and steps show
        for name, parameter in module.named_parameters():
            if name.startswith("ln"):
                parameter.add_(random(parameter.shape, seed=11, scale=0.2).cpu())
    return module.to(current_device())


PARALLEL = {"swiglu": ParallelSwiGLU, "attention": ParallelGroupedQueryAttention,
            "block": ParallelPartsBlock}


def tensor_parallel_pairs(kind, kv_heads, group):
    """(what, parallel, reference) triples of one TP module against its single-device one, and
    of the single-device module after the parallel step against before."""
    reference = build(kind, kv_heads)
    before = parameters_of(reference)
    parallel = PARALLEL[kind](reference, group)
    pairs = one_step_pairs(reference, parallel, random(SHAPE, seed=1), group, lr=LR, seed=2)
    return pairs + source_pairs(reference, before)


def sequence_parallel_pairs(kind, kv_heads, group):
    """The SP Llama block on this rank's shard of the sequence against the block on the whole
    sequence: outputs and input gradients gathered along the sequence, parameter gradients after
    ``sync_sequence_parallel_grads``, weights after an SGD step."""
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    reference = build(kind, kv_heads)
    sp = ParallelPartsBlock(reference, group, sequence_parallel=True)
    x, upstream = random(SHAPE, seed=1), random(SHAPE, seed=2)
    x = x.clone().requires_grad_()
    y = reference(x)
    y.backward(upstream)
    x_shard = x.detach().chunk(tp, dim=1)[rank].clone().requires_grad_()
    y_shard = sp(x_shard)
    y_shard.backward(upstream.chunk(tp, dim=1)[rank])
    sync_sequence_parallel_grads(sp, group)
    parameters = dict(reference.named_parameters())
    pairs = [("output", all_gather_along(y_shard.detach(), 1, group), y),
             ("input grad", all_gather_along(x_shard.grad, 1, group), x.grad)]
    pairs += [(f"grad of {name}", grad, parameters[name].grad)
              for name, grad in full_state(sp, group, grads=True).items()]
    for module in (reference, sp):
        torch.optim.SGD(module.parameters(), lr=LR).step()
    pairs += [(f"{name} after a step", value, parameters[name])
              for name, value in full_state(sp, group).items()]
    return [(what, a.detach().cpu(), b.detach().cpu()) for what, a, b in pairs]


def replicated_heads_held(kv_heads, group):
    """Which KV head this rank's replicated k computes, and that it holds k whole."""
    attention = ParallelGroupedQueryAttention(build("attention", kv_heads), group)
    assert isinstance(attention.k, ReplicatedHeads)
    return attention.k.rows, tuple(attention.k.weight.shape), attention.heads


# (name, "tp" or "sp", kind, kv_heads, on the pairs or on the world)
CASES = [
    ("swiglu tp2", "tp", "swiglu", 4, "pairs"),
    ("swiglu tp4", "tp", "swiglu", 4, "world"),
    ("attention kv4 split over tp2", "tp", "attention", 4, "pairs"),
    ("attention kv4 split over tp4", "tp", "attention", 4, "world"),
    ("attention kv2 replicated over tp4", "tp", "attention", 2, "world"),
    ("attention kv1 replicated over tp2", "tp", "attention", 1, "pairs"),
    ("block kv4 tp2", "tp", "block", 4, "pairs"),
    ("block kv4 tp4", "tp", "block", 4, "world"),
    ("block kv2 tp4 (replicated)", "tp", "block", 2, "world"),
    ("sp block kv4 tp2", "sp", "block", 4, "pairs"),
    ("sp block kv2 tp4 (replicated)", "sp", "block", 2, "world"),
    ("sp block with gpt attention tp2", "sp", "block with gpt attention", 4, "pairs"),
    ("sp block with gelu mlp tp4", "sp", "block with gelu mlp", 4, "world"),
]


def every_case():
    pair_groups = [dist.new_group(ranks) for ranks in PAIRS]  # every rank creates every group
    groups = {"pairs": pair_groups[dist.get_rank() // 2], "world": None}
    results = {}
    for name, mode, kind, kv_heads, where in CASES:
        group = groups[where]
        results[name] = (tensor_parallel_pairs(kind, kv_heads, group) if mode == "tp"
                         else sequence_parallel_pairs(kind, kv_heads, group))
    results["held"] = replicated_heads_held(2, None)
    return results


def test_llama_parts_match_the_single_device_parts(run_on_ranks):
    results = run_on_ranks(every_case, WORLD, timeout=180)
    failures = []
    for name, *_ in CASES:
        by_rank = [result[name] for result in results]
        try:
            assert_equivalent(by_rank, **TOLERANCE)
        except AssertionError as error:
            failures.append(f"{name}: {error}")
        worst = max((a.double() - b.double()).abs().max().item() for pairs in by_rank
                    for _, a, b in pairs)
        print(f"\n{name}: largest difference {worst:.1e}", end="")
    assert not failures, "\n".join(failures)
    head_dim = HIDDEN // HEADS
    for rank, result in enumerate(results):  # kv_heads 2 over tp 4, attention.k
        rows, shape, query_heads = result["held"]
        kv_head = rank // 2  # ranks 0, 1 use KV head 0; ranks 2, 3 KV head 1
        assert rows == slice(kv_head * head_dim, (kv_head + 1) * head_dim), f"rank {rank}: {rows}"
        assert shape == (2 * head_dim, HIDDEN) and query_heads == HEADS // WORLD, (
            f"rank {rank}: k {shape}, {query_heads} query heads")
