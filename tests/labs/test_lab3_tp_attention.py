"""Lab 3, graded: Megatron tensor-parallel attention and the TP transformer block against the
single-device ones, on tp = 1, 2, 4, then on every layout of TP groups in a world of 4
(``reference_impl.course.sweeps``: consecutive, strided, permuted, the world; ``--sweep-seed N``
draws another) in fp32 and bf16 (autocast; atol = rtol = 5e-2), two SGD steps in a row; their
communication against the contract (kind, the group's ranks, bytes); heads that do not divide
refused.

The expected values come from a copy of the single-device module made before the submission is
loaded; the module the submission builds from is checked after its step too, so a parallel
module that shares a parameter with it (the same tensor, not a copy) is caught. A failing output
is matched against what the known mistakes compute (a wrong attention scale, the projection's
bias counted tp times), computed in the same rank from the single-device module.

Tolerance: fp32, atol 1e-5 on outputs, input gradients, every parameter gradient and every
weight after an SGD step (observed: at most a few 1e-6); the course notes "Week 15 - Tensor
Parallelism and Pipeline Parallelism" ask for 1e-3 at most.
"""
import copy
import math
import zlib

import pytest
import torch

from reference_impl.comm.comm_trace import CommTracer
from reference_impl.equivalence import (as_if_trained, assert_equivalent, one_step,
                                        parallel_pairs, parameters_of, reference_step,
                                        source_pairs)
from reference_impl.comm.device import current_device
from reference_impl.model import (Block, CausalSelfAttention, ModelConfig, attention_core,
                                  merge_heads, split_heads)

from reference_impl.checks import assert_close_naming, attempt
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import group_layouts, group_of, label
from reference_impl.model.precision import autocast
from reference_impl.tp.tp_layers import full_state

pytestmark = pytest.mark.lab3

ATOL = 1e-5
SHAPES = [  # (hidden, heads, seq, batch)
    (16, 4, 8, 2),
]


FORWARD_INHERITED = (
    "ParallelSelfAttention has no forward of its own: the single-device "
    "CausalSelfAttention.forward it inherits runs instead. Write it for this rank's heads")


def scale_mistakes(attention, x, tp):
    """What the single-device attention computes with a wrong scale in place of 1/sqrt(d)."""
    d = attention.qkv.in_features // attention.heads

    def output(scale):
        with torch.no_grad():
            q, k, v = split_heads(attention.qkv(x), attention.heads)
            core = attention_core(q * scale * math.sqrt(d), k, v, attention.attention)
            return attention.proj(merge_heads(core))

    hidden = attention.qkv.in_features
    return {f"the attention scale is 1/sqrt(h/tp) = 1/sqrt({hidden // tp}), this rank's width; "
            f"it is 1/sqrt(d) = 1/sqrt({d}), d the size of one head": output(
                1 / math.sqrt(hidden // tp)),
            f"the attention scale is 1/sqrt(h) = 1/sqrt({hidden}), the whole width; it is "
            f"1/sqrt(d) = 1/sqrt({d}), d the size of one head": output(1 / math.sqrt(hidden)),
            "the attention scores are not scaled: softmax(q k^T / sqrt(d)), d the size of one "
            "head": output(1.0),
            MERGED_BY_RESHAPE: merged_by_reshape(attention, x)}


MERGED_BY_RESHAPE = (
    "the heads were merged back by a plain reshape of (batch, heads, seq, d): the heads must "
    "sit next to d before they are flattened into one row per token (the model's merge_heads)")
ONE_RANK = (
    "with one rank nothing is split or reduced, so the difference is in the computation itself: "
    "how the heads are split and merged back, the scale, the mask")


def merged_by_reshape(attention, x):
    """The single-device attention with its heads flattened without moving them next to d."""
    with torch.no_grad():
        q, k, v = split_heads(attention.qkv(x), attention.heads)
        core = attention_core(q, k, v, attention.attention)
        return attention.proj(core.reshape(x.shape[0], x.shape[1], -1))


def attention_pairs(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    attention = CausalSelfAttention(hidden, heads).to(device)
    x = torch.randn(batch, seq, hidden).to(device)
    tp = torch.distributed.get_world_size()
    expected, before = reference_step(attention, x), parameters_of(attention)
    mistakes = {"output": scale_mistakes(attention, x, tp)}
    with torch.no_grad():
        mistakes["output"][PROJECTION_BIAS_BEFORE_THE_REDUCE] = (
            expected["output"] + (tp - 1) * attention.proj.bias.cpu())
    module = impl.module("tp_attention")
    parallel = module.ParallelSelfAttention(attention)
    pairs = parallel_pairs(parallel, x, expected) + source_pairs(attention, before)
    return pairs, mistakes, "forward" in vars(module.ParallelSelfAttention)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-heads{}-seq{}-b{}".format(*s))
def test_tp_attention_matches_single_device(impl, run_on_ranks, world_size, shape):
    check_attention(run_on_ranks, impl, world_size, shape)


def check_attention(run_on_ranks, impl, world_size, shape):
    """The attention on the world of ``world_size`` ranks against the single-device one."""
    results = run_on_ranks(attention_pairs, world_size, impl, *shape)
    try:
        assert_equivalent([pairs for pairs, _, _ in results], atol=ATOL, mistakes=results[0][1])
    except AssertionError as failure:
        if world_size > 1 or any(text in str(failure) for text in results[0][1]["output"]):
            raise
        raise AssertionError(f"{failure}\n{ONE_RANK}") from None
    assert results[0][2], FORWARD_INHERITED


def block_pairs(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    block = as_if_trained(Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq))).to(device)
    x = torch.randn(batch, seq, hidden).to(device)
    expected, before = reference_step(block, x), parameters_of(block)
    parallel = impl.module("tp_attention").ParallelBlock(block)
    return parallel_pairs(parallel, x, expected) + source_pairs(block, before)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-heads{}-seq{}-b{}".format(*s))
def test_tp_block_matches_single_device(impl, run_on_ranks, world_size, shape):
    check_block(run_on_ranks, impl, world_size, shape)


def check_block(run_on_ranks, impl, world_size, shape):
    """The block on the world of ``world_size`` ranks against the single-device one."""
    assert_equivalent(run_on_ranks(block_pairs, world_size, impl, *shape), atol=ATOL)


def block_collectives(impl, hidden, heads, seq, batch):
    device = current_device()
    torch.manual_seed(0)
    block = impl.module("tp_attention").ParallelBlock(
        Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device))
    x = torch.randn(batch, seq, hidden).to(device).requires_grad_()
    with CommTracer() as forward:
        y = block(x)
    with CommTracer() as backward:
        y.sum().backward()
    return [(trace.summary(), trace.total_bytes("all_reduce")) for trace in (forward, backward)]


def test_tp_block_does_two_all_reduces_each_way_of_the_activation_size(impl, run_on_ranks):
    hidden, heads, seq, batch = 16, 4, 8, 2
    activation_bytes = batch * seq * hidden * 4  # fp32: b * s * h * 4 bytes
    results = run_on_ranks(block_collectives, 2, impl, hidden, heads, seq, batch)
    for rank, passes in enumerate(results):
        for direction, (summary, nbytes) in zip(("forward", "backward"), passes):
            assert summary == {"all_reduce": 2}, (
                f"rank {rank}: the TP block's {direction} ran {summary}; Megatron's runs 2 "
                "all-reduces (attention and MLP) and nothing else")
            assert nbytes == 2 * activation_bytes, (
                f"rank {rank}: the {direction} all-reduced {nbytes} bytes; the formula gives "
                f"2 x b*s*h*4 = {2 * activation_bytes}")


CONTIGUOUS_QKV = (
    "the fused QKV weight was split contiguously (tp chunks of the 3h rows): rank 0 then holds "
    "queries where split_heads reads keys and values; each of the q, k and v blocks must be "
    "split on its own (blocks=3), so that a rank holds the q, k and v of the same heads")
EVERY_HEAD = (
    "every head on every rank: a rank must compute heads/tp heads (its own), with the q, k and "
    "v rows of those heads only")
PROJECTION_BIAS_BEFORE_THE_REDUCE = (
    "the output projection's bias was added on every rank before the all-reduce: the sum of "
    "the ranks' partial outputs then counts it tp times; it is added once, after the sum")
PAIRS = [[0, 1], [2, 3]]  # two TP groups of 2 at once, in a world of 4


def qkv_rows(hidden, tp, tp_rank):
    """The rows of the fused [q; k; v] weight (3 blocks of ``hidden``) that TP rank ``tp_rank``
    of ``tp`` holds: lab 2's snapshot of ``shard``."""
    return snapshot("lab2", "positions")[f"{3 * hidden}/3/{tp}"][tp_rank]


def attention_on_two_groups(impl, hidden, heads, seq, batch):
    """World of 4, two TP groups of 2 at once: this rank's heads and qkv rows, and the
    attention and the block against their single-device originals, over this rank's group."""
    device, rank = current_device(), torch.distributed.get_rank()
    groups = [torch.distributed.new_group(ranks) for ranks in PAIRS]
    group = groups[rank // 2]
    torch.manual_seed(0)
    attention = CausalSelfAttention(hidden, heads).to(device)
    block = Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device)
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(rank // 2))
    x = x.to(device)
    full_qkv = attention.qkv.weight.detach().clone()
    probe = CausalSelfAttention(hidden, heads).to(device)  # a zero projection: output = its bias
    with torch.no_grad():
        probe.proj.weight.zero_()
    probe_bias = probe.proj.bias.detach().clone()
    expected = {"attention": reference_step(attention, x), "block": reference_step(block, x)}
    mistakes = {"output": scale_mistakes(attention, x, len(PAIRS[0]))}

    before = {"attention": parameters_of(attention), "block": parameters_of(block)}

    module = impl.module("tp_attention")
    parallel = module.ParallelSelfAttention(attention, group)
    local_qkv = dict(parallel.named_parameters())["qkv.weight"].detach().clone()
    bias_only = module.ParallelSelfAttention(probe, group)(x).detach()
    parallel_block = module.ParallelBlock(block, group)
    return {"heads": parallel.heads, "qkv": (local_qkv, full_qkv),
            "bias only": (bias_only, probe_bias),
            "attention": parallel_pairs(parallel, x, expected["attention"], group)
            + source_pairs(attention, before["attention"]),
            "block": parallel_pairs(parallel_block, x, expected["block"], group)
            + source_pairs(block, before["block"]),
            "own forward": "forward" in vars(module.ParallelSelfAttention),
            "mistakes": mistakes}


def test_each_rank_computes_its_heads_with_two_groups_at_once(impl, run_on_ranks):
    hidden, heads, tp = 16, 4, 2
    results = run_on_ranks(attention_on_two_groups, 4, impl, hidden, heads, 8, 2)
    assert results[0]["own forward"], FORWARD_INHERITED
    for rank, checks in enumerate(results):
        tp_rank = rank % 2
        assert checks["heads"] == heads // tp, (
            f"rank {rank}: ParallelSelfAttention.heads is {checks['heads']}, this rank computes "
            f"heads/tp = {heads}/{tp} = {heads // tp} heads. Likely cause: {EVERY_HEAD}")
        local, full = checks["qkv"]
        mine = qkv_rows(hidden, tp, tp_rank)
        assert_close_naming(
            local, full[mine], "the local qkv.weight", rank=rank, atol=0,
            against="the q, k and v rows of this rank's heads",
            otherwise="rank r holds rows r*h/tp to (r+1)*h/tp of each of q, k and v",
            mistakes={CONTIGUOUS_QKV: full.chunk(tp)[tp_rank], EVERY_HEAD: full})
        output, bias = checks["bias only"]
        assert_close_naming(
            output, bias.expand_as(output), "the output with a zero projection weight",
            rank=rank, atol=ATOL, against="the projection's bias",
            otherwise="with a zero projection weight the output is its bias, once",
            mistakes={PROJECTION_BIAS_BEFORE_THE_REDUCE: tp * bias.expand_as(output)})
    for kind in ("attention", "block"):
        try:
            assert_equivalent([checks[kind] for checks in results], atol=ATOL,
                              mistakes=results[0]["mistakes"] if kind == "attention" else None)
        except AssertionError as failure:
            raise AssertionError(f"{kind}, TP groups [0, 1] and [2, 3] at once: {failure}") from None


# ---------------------------------------------------------------- every layout, fp32 and bf16

WORLD = 4
TOLERANCES = {"fp32": dict(atol=1e-5, rtol=1e-5), "bf16": dict(atol=5e-2, rtol=5e-2)}
ITEMSIZE = {"fp32": 4, "bf16": 2}
STEPS = 2  # SGD steps in a row, every output, gradient and parameter read after each
ATTENTION_CONTRACT = ("attention: forward one all-reduce of the output (after the row-parallel "
                      "projection), backward one all-reduce of the input gradient (f before the "
                      "QKV projection), over the TP group; nothing on a group of one")
BLOCK_CONTRACT = ("block: forward two all-reduces of the output's size (attention and MLP), "
                  "backward two all-reduces of the input gradient's size, over the TP group")
HEADS_OVER_THE_WORLD = ("the heads were divided by the world's size, not the TP group's: tp is the "
                        "size of the group the attention was given")
REFUSED = "heads {heads} is not divisible by the tensor-parallel size tp = {tp}"


def layout_cases(tp, seed, dtypes=("fp32", "bf16")):
    return [{"tp": tp, "layout": name, "dtype": dtype}
            for name in group_layouts(WORLD, tp, seed) for dtype in dtypes]


def traced(module, x, precision):
    """The collectives of one forward and one backward of ``module`` (CommCall data)."""
    x = x.detach().clone().requires_grad_()
    with CommTracer() as forward, autocast(precision, x.device):
        y = module(x)
    with CommTracer() as backward:
        y.float().sum().backward()
    return [[call.as_data() for call in trace.calls] for trace in (forward, backward)]


def attention_on_layouts(impl, tp, seed, shape, dtypes=("fp32", "bf16")):
    """Every layout of TP groups of ``tp`` on 4 ranks, every group at once with numbers of its
    own, in each dtype: the attention's and the block's pairs, their collectives, this rank's
    heads and qkv rows, and the refusal of heads that do not divide."""
    hidden, heads, seq, batch = shape
    device, rank = current_device(), torch.distributed.get_rank()
    module = impl.module("tp_attention")
    mine = {}
    for name, groups in group_layouts(WORLD, tp, seed).items():  # every rank, the same order
        handles = [torch.distributed.new_group(ranks) for ranks in groups]
        mine[name] = handles[groups.index(group_of(rank, groups))], groups.index(group_of(rank, groups))
    found = {}
    for config in layout_cases(tp, seed, dtypes):
        group, index = mine[config["layout"]]
        torch.manual_seed(zlib.crc32(f"{label(config, seed)}/{index}".encode()) % 2**31)
        precision = config["dtype"]
        attention = CausalSelfAttention(hidden, heads).to(device)
        block = Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device)
        if precision == "fp32":  # norms off their initial ones and zeros: no two alike
            as_if_trained(attention), as_if_trained(block)
        x = torch.randn(batch, seq, hidden).to(device)

        def case():
            expected = {"attention": [stepped(single, x, None, precision, step)
                                      for single in [copy.deepcopy(attention)]
                                      for step in range(STEPS)],
                        "block": [stepped(single, x, None, precision, step)
                                  for single in [copy.deepcopy(block)] for step in range(STEPS)]}
            before = {"attention": parameters_of(attention), "block": parameters_of(block)}
            with torch.no_grad():
                biased = {PROJECTION_BIAS_BEFORE_THE_REDUCE: expected["attention"][0]["output"]
                          + (tp - 1) * attention.proj.bias.cpu()}
            parallel = module.ParallelSelfAttention(copy.deepcopy(attention), group)
            qkv = dict(parallel.named_parameters())["qkv.weight"].detach().cpu().clone()
            built = module.ParallelBlock(copy.deepcopy(block), group)
            gathered = {name: value.detach().cpu()
                        for name, value in full_state(built, group).items()}
            calls = {"attention": traced(parallel, x, precision),
                     "block": traced(built, x, precision)}
            parallel = module.ParallelSelfAttention(attention, group)
            return {"heads": parallel.heads, "qkv": (qkv, attention.qkv.weight.detach().cpu()),
                    "attention": steps_pairs(parallel, x, expected["attention"], group, precision)
                    + source_pairs(attention, before["attention"]),
                    "block": steps_pairs(module.ParallelBlock(block, group), x, expected["block"],
                                         group, precision)
                    + source_pairs(block, before["block"]),
                    "calls": calls, "ranks": torch.distributed.get_process_group_ranks(group),
                    "built": (gathered, before["block"]),
                    "mistakes": {"output": biased}, "tp rank": torch.distributed.get_rank(group)}
        found[label(config, seed)] = attempt(case)
    found["refused"] = None
    if tp > 1:
        try:
            module.ParallelSelfAttention(CausalSelfAttention(2 * (tp + 1), tp + 1).to(device),
                                         next(iter(mine.values()))[0])
        except ValueError as error:
            found["refused"] = str(error)
    return found


def stepped(module, x, group, precision, step):
    """``one_step`` of ``module`` (upstream gradient seeded by ``step``), its values copied and
    its gradients cleared, so that the next step starts from the updated parameters alone."""
    found = one_step(module, x, group, precision=precision, seed=step)
    for parameter in module.parameters():
        parameter.grad = None
    return {what: None if value is None else value.clone() for what, value in found.items()}


def steps_pairs(parallel, x, expected, group, precision):
    """(what, parallel, single-device) of every step of ``expected`` (the single-device one's
    ``one_step`` results, step after step): step 1's under their names, later steps' named
    with their step, so that a wrong update shows as the step it breaks."""
    pairs = []
    for step, wanted in enumerate(expected):
        found = stepped(parallel, x, group, precision, step)
        pairs += [(what if step == 0 else f"{what}, step {step + 1}", found[what], wanted[what])
                  for what in wanted]
    return pairs



def check_on_layouts(results, tp, seed, shape, dtypes=("fp32", "bf16")):
    """Per case and rank: the heads, the qkv rows, the collectives (units), then the attention's
    and the block's step against the single-device ones (compositions)."""
    hidden, heads, seq, batch = shape
    for config in layout_cases(tp, seed, dtypes):
        where = f"[{label(config, seed)}]"
        for rank, found in enumerate(results):
            got = found[label(config, seed)]
            assert not isinstance(got, str), f"TP attention {where} raised on rank {rank}: {got}"
            cause = HEADS_OVER_THE_WORLD if got["heads"] == heads // WORLD else EVERY_HEAD
            assert got["heads"] == heads // tp, (
                f"ParallelSelfAttention {where} on rank {rank}: heads is {got['heads']}, this rank "
                f"computes heads/tp = {heads}/{tp} = {heads // tp} heads. Likely cause: {cause}")
            local, full = got["qkv"]
            assert_close_naming(
                local, full[qkv_rows(hidden, tp, got["tp rank"])], f"the local qkv.weight {where}",
                rank=rank, atol=0, against="the q, k and v rows of this rank's heads",
                otherwise="rank r of the group holds its heads' rows of each of q, k and v",
                mistakes={CONTIGUOUS_QKV: full.chunk(tp)[got["tp rank"]], EVERY_HEAD: full}
                if tp > 1 else {})
            size = batch * seq * hidden
            out, grad = size * ITEMSIZE[config["dtype"]], size * 4
            wanted = {"attention": ([expected("all_reduce", got["ranks"], out)],
                                    [expected("all_reduce", got["ranks"], grad)]),
                      "block": ([expected("all_reduce", got["ranks"], out)] * 2,
                                [expected("all_reduce", got["ranks"], grad)] * 2)}
            for kind, formula in (("attention", ATTENTION_CONTRACT), ("block", BLOCK_CONTRACT)):
                for phase, calls, operations in zip(("forward", "backward"), got["calls"][kind],
                                                    wanted[kind]):
                    check_contract(calls, operations if tp > 1 else [],
                                   f"the TP {kind} {where}: the {phase}", rank=rank,
                                   formula=formula)
        for rank, found in enumerate(results):
            check_built_block(*found[label(config, seed)]["built"], f"{where} on rank {rank}")
        for kind in ("attention", "block"):
            try:
                assert_equivalent([found[label(config, seed)][kind] for found in results],
                                  **TOLERANCES[config["dtype"]],
                                  mistakes=results[0][label(config, seed)]["mistakes"]
                                  if kind == "attention" else None)
            except AssertionError as failure:
                raise AssertionError(f"the TP {kind} {where}: {failure}") from None
    if tp > 1:
        for rank, found in enumerate(results):
            wanted = REFUSED.format(heads=tp + 1, tp=tp)
            assert found["refused"] and wanted in found["refused"], (
                f"rank {rank}: a ParallelSelfAttention whose heads do not divide by tp = {tp} "
                f"gave {found['refused']!r}; it must refuse with a ValueError saying {wanted!r}")


def check_built_block(gathered, single, where):
    """The ParallelBlock as built, gathered whole (lab 2's full_state), against the block it
    was made from, parameter by parameter: a unit check before any step."""
    assert sorted(gathered) == sorted(single), (
        f"ParallelBlock {where} has parameters {sorted(gathered)}, the block {sorted(single)}: "
        "the same names, so that they pair up")
    for name, value in single.items():
        same = torch.equal(gathered[name], value)  # a name, so no tensor is printed
        assert same, (
            f"ParallelBlock {where}: {name}, gathered whole, is not the block's {name} "
            f"(largest difference {(gathered[name].float() - value.float()).abs().max():.3g}). "
            "Likely cause: a part built from another part of the block than its namesake, or "
            "split in another order than it is gathered")


def check_attention_on_layouts(run_on_ranks, impl, tp, seed, shape, dtypes=("fp32", "bf16")):
    results = run_on_ranks(attention_on_layouts, WORLD, impl, tp, seed, shape, dtypes,
                           timeout=120)
    check_on_layouts(results, tp, seed, shape, dtypes)


@pytest.mark.parametrize("tp", [2, 4], ids=["tp2-layouts", "tp4-world"])
def test_attention_and_block_on_every_layout(impl, run_on_ranks, sweep_seed, tp):
    check_attention_on_layouts(run_on_ranks, impl, tp, sweep_seed, (16, 4, 5, 2))
