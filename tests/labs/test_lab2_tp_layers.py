"""Lab 2, graded: Megatron's autograd collectives (f = ``copy_to_tp``, g = ``reduce_from_tp``),
``shard``, the column- and row-parallel linear layers, then the layers composed, each against
its single-device original.

What is swept (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws other permuted
groups and other numbers, and every failure prints its seed and case): on 4 ranks, TP groups of
1 ([0], [1], [2], [3]), of 2 (consecutive [0, 1] [2, 3], strided [0, 2] [1, 3], permuted) and
of 4 (the world), every group of a layout at once, each group on numbers of its own; fp32 and
bf16 (the layers under bf16 autocast, ``precision.py``).

Units first, then compositions, so that a failure blames the function that is wrong:

1. **f and g alone**, on every layout and also on the default group (None, the world): the
   output, the input gradient, the incoming gradient tensor left as it was (autograd hands the
   same gradient tensor to every input of an add, so a backward that all-reduces it in place
   changes its neighbours' gradients), and the **communication contract**
   (``comm_contract.check_contract``): f forward nothing, backward one all-reduce of the input
   gradient's bytes over the TP group's ranks; g forward one all-reduce of the output's bytes,
   backward nothing; on a group of one, nothing.
2. **shard** alone (one process): piece r of every block.
3. **The layers alone**: ``ColumnParallelLinear`` with a bias and blocks = 1, 2 and 3 (2 output
   features per block per rank, so a fused tensor split contiguously gives other rows),
   gathered, and its own slice of the output; ``RowParallelLinear`` splitting its input;
   input features that do not divide by tp where the column layer allows them (5), output
   features that do not divide where the row layer allows them (5); a zero-weight row layer
   (its output is its bias, once); the sizes each layer must refuse. Output, input gradient,
   every parameter's gradient (gathered) and every parameter after an SGD step, and the
   contract: column forward an all-gather of the whole output (gathered) or nothing, backward
   one all-reduce of the input gradient; row forward one all-reduce of the output, backward
   one all-gather of the input gradient.
4. **Compositions where a gradient tensor is shared**: ``fc2(fc1(x) + f(x))`` (a residual into
   the shards: f's output is an operand of an add, whose gradient tensor is also fc1's),
   ``x + ParallelMLP(x)`` (a residual around the block) and ``col1(x) + col2(x)`` (one input,
   two layers); the same checks, and the contract (the MLP: one all-reduce each way).

Tolerances: fp32 atol = rtol = 1e-5 (only the order of additions changes; observed a few
1e-7); bf16 atol = rtol = 5e-2 (8 bits of mantissa: the single-device reference rounds other
partial sums; observed up to 1.6e-2); the collectives alone fp32 1e-6, bf16 2e-2 (a sum of at
most 4 numbers near 1 rounded once to 8 bits).
"""
import copy
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.checks import assert_close, assert_close_naming, attempt
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import group_layouts, group_of, label
from reference_impl.equivalence import (likely_cause, parallel_pairs, parameters_of,
                                        reference_step, source_pairs)
from reference_impl.model import MLP
from reference_impl.model.precision import autocast

pytestmark = pytest.mark.lab2

WORLD = 4
TP_SIZES = (1, 2, 4)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LAYER_TOLERANCE = {"fp32": dict(atol=1e-5, rtol=1e-5), "bf16": dict(atol=5e-2, rtol=5e-2)}
UNIT_TOLERANCE = {"fp32": dict(atol=1e-6, rtol=1e-6), "bf16": dict(atol=2e-2, rtol=2e-2)}
SHAPE = (3, 4)
BATCH, SEQ = 2, 3
TIMEOUT = 120

COPY_BACKWARD_NOT_REDUCED = (
    "copy_to_tp's backward does not all-reduce: each rank keeps only its own shard's part of "
    "the input gradient, while x fed every rank's shard (f's backward sums over the group)")
REDUCE_BACKWARD_REDUCED = (
    "reduce_from_tp's backward all-reduces too: the gradient of a sum reaches every addend "
    "unchanged, and every rank already holds it; summed again, it is counted tp times "
    "(g's backward is the identity)")
WRONG_GROUP = ("the collective ran over the whole world, not over the group it was given: "
               "pass the group to torch.distributed")
IN_PLACE = (
    "copy_to_tp's backward all-reduced the incoming gradient in place: autograd hands one "
    "gradient tensor to every input of an add, so a gradient tensor shared by an add came out "
    "summed over the group for the add's other input too (its weight gradient tp times or more "
    "too large). Sum on a copy (_all_reduce clones first)")
CONTIGUOUS_SPLIT = (
    "the fused blocks were split as one contiguous tensor: with blocks=3 (a fused [q; k; v]) "
    "each block is split in tp on its own, and rank r keeps piece r of every block")
FUSED_BIAS = (
    "the fused bias was split as one contiguous tensor: with blocks > 1 the bias is fused like "
    "the weight's rows, so each block of it is split in tp on its own (sharded_parameter(bias, "
    "0, group, blocks)), or rank r adds another rank's bias entries to its output features")
BIAS_BEFORE_THE_REDUCE = (
    "the row-parallel bias was added on every rank before the all-reduce: the sum then counts "
    "it tp times; the whole bias belongs to the sum, added once, after reduce_from_tp")


# ----------------------------------------------------------------- the plan (both sides)

def layouts(seed: int) -> list[tuple[int, str, list[list[int]]]]:
    """(tp, layout name, groups) of every layout swept on WORLD ranks."""
    return [(tp, name, groups) for tp in TP_SIZES
            for name, groups in group_layouts(WORLD, tp, seed).items()]


def make_groups(seed: int) -> dict[str, object]:
    """Every group of every layout, created on every rank in the same order (new_group is
    collective); {layout key: this rank's group}."""
    mine = {}
    for tp, name, groups in layouts(seed):
        handles = [dist.new_group(ranks) for ranks in groups]
        mine[f"tp {tp}, {name}"] = handles[groups.index(group_of(dist.get_rank(), groups))]
    return mine


def numbers(key: str, shape, dtype=torch.float32) -> torch.Tensor:
    """Seeded normal numbers named by ``key`` (the same in the ranks and in the test)."""
    generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    return torch.randn(shape, generator=generator).to(dtype)


def group_key(config: dict, seed: int, groups: list[list[int]], rank: int) -> str:
    """A key for the numbers of ``rank``'s group in a case: each group has its own."""
    return f"{label(config, seed)}/group {groups.index(group_of(rank, groups))}"


def itemsize(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def compute_bytes(precision: str) -> int:
    """Bytes of an element a layer computes (a matrix product under autocast is bf16; the
    input, and the gradient that comes back to it, stay fp32)."""
    return itemsize(DTYPES[precision])


def check_groups(calls, ranks, where, rank):
    """Every collective of a phase over the TP group it was given, else the group is named."""
    for call in calls:
        assert sorted(call["ranks"]) == sorted(ranks), (
            f"{where} on rank {rank}: {call['op']} ran over ranks {sorted(call['ranks'])}, "
            f"not the TP group {sorted(ranks)} the layer was given. Likely cause: {WRONG_GROUP} "
            "(a collective or copy_to_tp/reduce_from_tp called without self.group)")


# ----------------------------------------------------------------- 1. f and g alone

COLLECTIVES = {"copy_to_tp": "forward nothing; backward one all-reduce of the input gradient "
                             "over the TP group",
               "reduce_from_tp": "forward one all-reduce of the output over the TP group; "
                                 "backward nothing"}


def collective_cases(seed: int) -> list[dict]:
    """Every layout (and the default group None, the world) in fp32 and bf16."""
    cases = [{"tp": tp, "layout": name, "dtype": dtype}
             for tp, name, _ in layouts(seed) for dtype in DTYPES]
    return cases + [{"tp": WORLD, "layout": "default group (None)", "dtype": dtype}
                    for dtype in DTYPES]


def ranks_of_case(config: dict, rank: int, seed: int) -> list[int]:
    if config["layout"] == "default group (None)":
        return list(range(WORLD))
    return group_of(rank, group_layouts(WORLD, config["tp"], seed)[config["layout"]])


def collective_inputs(config, seed, rank):
    """(x, upstream gradient) of ``rank`` in a case, in the case's dtype."""
    dtype = DTYPES[config["dtype"]]
    return (numbers(f"{label(config, seed)}/x/{rank}", SHAPE, dtype),
            numbers(f"{label(config, seed)}/upstream/{rank}", SHAPE, dtype))


def through_collective(impl, name: str, seed: int):
    """Every case: rank r's own x_r through the collective, backward with rank r's own g_r;
    (y, x.grad, whether g_r was changed, forward calls, backward calls)."""
    rank = dist.get_rank()
    device = current_device()
    groups = make_groups(seed)
    cases = collective_cases(seed)
    collective = getattr(impl.module("tp_collectives"), name)
    found = {}
    for config in cases:
        group = groups.get(f"tp {config['tp']}, {config['layout']}")
        x, upstream = (t.to(device) for t in collective_inputs(config, seed, rank))
        x.requires_grad_()
        kept = upstream.clone()
        with CommTracer() as forward:
            y = collective(x, group)
        with CommTracer() as backward:
            y.backward(upstream)
        found[label(config, seed)] = {
            "output": y.detach().cpu(), "input grad": x.grad.cpu(),
            "changed": not torch.equal(upstream, kept),
            "calls": [[call.as_data() for call in trace.calls] for trace in (forward, backward)]}
    return found


def summed(config, seed, ranks, which):
    return sum(collective_inputs(config, seed, r)[which].double() for r in ranks)


def collective_contract(name, config, ranks, nbytes):
    """[forward, backward] operations of f or g in a case."""
    if config["tp"] == 1:
        return [[], []]
    reduce = [expected("all_reduce", ranks, nbytes)]
    return [[], reduce] if name == "copy_to_tp" else [reduce, []]


def check_collective(name, rank, config, seed, result):
    ranks = ranks_of_case(config, rank, seed)
    x, upstream = collective_inputs(config, seed, rank)
    where = f"{name} over the group {ranks} [{label(config, seed)}]"
    tolerance = UNIT_TOLERANCE[config["dtype"]]
    world = range(WORLD)
    if name == "copy_to_tp":
        assert_close(result["output"], x, f"{where}: output", rank=rank, **tolerance,
                     likely_cause="the forward must return x unchanged")
        assert_close_naming(
            result["input grad"], summed(config, seed, ranks, 1), f"{where}: input gradient",
            rank=rank, **tolerance, otherwise="the backward must all-reduce (sum) the gradient "
            "over the group it is given",
            mistakes={COPY_BACKWARD_NOT_REDUCED: upstream, WRONG_GROUP: summed(config, seed, world, 1)}
            if config["tp"] > 1 else {})
        assert not result["changed"], f"{where} on rank {rank}: {IN_PLACE}"
    else:
        assert_close_naming(
            result["output"], summed(config, seed, ranks, 0), f"{where}: output", rank=rank,
            **tolerance, otherwise="the forward must all-reduce (sum) x over the group",
            mistakes={WRONG_GROUP: summed(config, seed, world, 0)} if config["tp"] > 1 else {})
        assert_close_naming(
            result["input grad"], upstream, f"{where}: input gradient", rank=rank, **tolerance,
            otherwise="the backward must pass the gradient on unchanged",
            mistakes={REDUCE_BACKWARD_REDUCED: summed(config, seed, ranks, 1)}
            if config["tp"] > 1 else {})
        assert not result["changed"], (
            f"{where} on rank {rank}: the backward changed the incoming gradient tensor; "
            "autograd may hand it to other inputs too: return it as it is")
    nbytes = x.numel() * itemsize(x.dtype)
    for phase, calls, wanted in zip(("forward", "backward"), result["calls"],
                                    collective_contract(name, config, ranks, nbytes)):
        check_contract(calls, wanted, f"{where}: the {phase}", rank=rank,
                       formula=COLLECTIVES[name])


def check_collective_on_every_layout(run_on_ranks, impl, name, seed):
    found = run_on_ranks(through_collective, WORLD, impl, name, seed, timeout=TIMEOUT)
    for config in collective_cases(seed):
        for rank, results in enumerate(found):
            check_collective(name, rank, config, seed, results[label(config, seed)])


def test_copy_to_tp_is_identity_forward_all_reduce_backward(impl, run_on_ranks, sweep_seed):
    check_collective_on_every_layout(run_on_ranks, impl, "copy_to_tp", sweep_seed)


def test_reduce_from_tp_is_all_reduce_forward_identity_backward(impl, run_on_ranks, sweep_seed):
    check_collective_on_every_layout(run_on_ranks, impl, "reduce_from_tp", sweep_seed)


# ----------------------------------------------------------------- 2. shard alone

def shards_of_numbered_rows(impl, shard_layouts):
    """shard() of a tensor whose entry is its own row number, for several layouts; and the
    shard again after the full tensor was changed (a view would change with it)."""
    shard = impl.module("tp_layers").shard
    results = {}
    for rows, dim, tp, blocks in shard_layouts:
        full = torch.arange(rows, dtype=torch.float32).repeat(5, 1)  # (5, rows): dim 1
        if dim == 0:
            full = full.T.contiguous()  # (rows, 5)
        results[(dim, tp, blocks)] = [shard(full, dim, rank, tp, blocks) for rank in range(tp)]
        full.add_(1000.0)
        results[(dim, tp, blocks)].append(shard(full, dim, 0, tp, blocks) - 1000.0)
    return {f"{key}": value for key, value in results.items()}


SHARD_LAYOUTS = [(12, 0, 2, 3), (12, 1, 2, 3), (24, 0, 4, 3), (8, 0, 4, 1), (12, 1, 3, 2)]


def rows_of(rank, rows, blocks, tp):
    """The entries rank ``rank`` of ``tp`` holds of a dimension of ``rows`` entries made of
    ``blocks`` blocks (lab 2's snapshot)."""
    return snapshot("lab2", "positions")[f"{rows}/{blocks}/{tp}"][rank]


def test_shard_keeps_piece_r_of_every_block(impl, run_alone):
    check_shard(run_alone, impl, SHARD_LAYOUTS)


def check_shard(run_alone, impl, shard_layouts):
    """shard() of numbered tensors, (rows, dim, tp, blocks) each of ``shard_layouts``."""
    results = run_alone(shards_of_numbered_rows, impl, shard_layouts)
    for rows, dim, tp, blocks in shard_layouts:
        *shards, moved = results[f"{(dim, tp, blocks)}"]
        for rank, local in enumerate(shards):
            kept = torch.tensor(rows_of(rank, rows, blocks, tp), dtype=torch.float32)
            expected_rows = kept.repeat(5, 1) if dim == 1 else kept.repeat(5, 1).T
            contiguous = torch.arange(rows, dtype=torch.float32).chunk(tp)[rank]
            assert_close_naming(
                local, expected_rows, f"shard(dim={dim}, tp={tp}, blocks={blocks})", rank=rank,
                atol=0, against="the rows of this rank's pieces, block by block",
                otherwise=f"rank r keeps piece r of each of the {blocks} blocks along dim {dim}",
                mistakes={CONTIGUOUS_SPLIT: contiguous.repeat(5, 1) if dim == 1
                          else contiguous.repeat(5, 1).T})
        same = moved.shape == shards[0].shape and bool((moved == shards[0]).all())
        assert same, (
            f"shard(dim={dim}, tp={tp}, blocks={blocks}) changed when the full tensor was "
            "changed afterwards: it returns a view of the full tensor; a shard must be a tensor "
            "of its own (the parameter is trained on its own)")


# ----------------------------------------------------------------- 3. the layers alone

LAYERS = ("column, gathered", "column, own slice", "row, split input")
COLUMN_IN, ROW_OUT, PIECE = 5, 5, 2  # 5 need not divide by tp; 2 features per block per rank
LAYER_FORMULA = ("column: forward an all-gather of the whole output if gathered (nothing if it "
                 "keeps its slice), backward one "
                 "all-reduce of the input gradient; row (split input): forward one all-reduce "
                 "of the output, backward one all-gather of the input gradient; all over the "
                 "TP group; nothing on a group of one")
REFUSALS = [("ColumnParallelLinear", (6, 5), {}, "output features 5 is not divisible by the "
              "tensor-parallel size tp = 2"),
             ("ColumnParallelLinear", (6, 9), {"blocks": 3}, "output features per block (3 "
              "blocks) 3 is not divisible"),
             ("RowParallelLinear", (5, 6), {}, "input features 5 is not divisible by the "
              "tensor-parallel size tp = 2")]


def layer_cases(seed: int) -> list[dict]:
    """Every layout; the column layer keeping its own slice with blocks 1, 2, 3 and gathered
    (blocks 1: a fused layer is not gathered), the row layer; each in fp32 and bf16."""
    cases = []
    for tp, name, _ in layouts(seed):
        variants = [("column, own slice", blocks) for blocks in (1, 2, 3)]
        variants += [("column, gathered", 1), ("row, split input", None)]
        for layer, blocks in variants:
            for dtype in DTYPES:
                config = {"tp": tp, "layout": name, "layer": layer, "blocks": blocks,
                          "dtype": dtype}
                cases.append({key: value for key, value in config.items() if value is not None})
    return cases


def layer_features(config) -> tuple[int, int]:
    if config["layer"].startswith("column"):
        return COLUMN_IN, PIECE * config["tp"] * config["blocks"]
    return 3 * config["tp"], ROW_OUT


def layer_and_input(config, key, device):
    """The single-device nn.Linear and the input of a case (seeded by ``key``)."""
    in_features, out_features = layer_features(config)
    torch.manual_seed(zlib.crc32(key.encode()) % 2**31)
    linear = nn.Linear(in_features, out_features).to(device)
    return linear, numbers(f"{key}/x", (BATCH, SEQ, in_features)).to(device)


def build_layer(layers, config, linear, group):
    if config["layer"].startswith("column"):
        return layers.ColumnParallelLinear(linear, group, blocks=config["blocks"],
                                           gather_output=config["layer"] == "column, gathered")
    return layers.RowParallelLinear(linear, group, input_is_parallel=False)


def fused_bias_output(linear, x, config, tp_rank):
    """Rank ``tp_rank``'s own output slice where the fused bias was split contiguously: its
    output features (piece r of every block) get chunk r of the whole bias."""
    columns = rows_of(tp_rank, linear.out_features, config["blocks"], config["tp"])
    return F.linear(x, linear.weight.detach()[columns], linear.bias.detach().chunk(config["tp"])[tp_rank])


def layer_mistakes(config, linear, x, reference, tp_rank):
    """{check: {known mistake: what it computes}}, from the single-device layer."""
    if config["layer"] == "row, split input":
        return {"output": {BIAS_BEFORE_THE_REDUCE:
                           reference["output"] + (config["tp"] - 1) * linear.bias.detach().cpu()}}
    if config["layer"] == "column, own slice" and config["blocks"] > 1 and config["tp"] > 1:
        return {"output": {FUSED_BIAS: fused_bias_output(linear, x, config, tp_rank).cpu()}}
    return {}


def gathered_state(module, group, grads=False) -> dict[str, torch.Tensor]:
    """Every parameter (or gradient) of ``module`` at full size, put together here (not by the
    submission's unshard): every rank's shard, marked with its dimension and blocks, is written
    at the entries lab 2's snapshot says that rank holds."""
    state, tp = {}, dist.get_world_size(group)
    for name, parameter in module.named_parameters():
        local = (parameter.grad if grads else parameter.detach()).contiguous()
        split, blocks = getattr(parameter, "tp_dim", None), getattr(parameter, "tp_blocks", 1)
        if split is not None:
            parts = [torch.empty_like(local) for _ in range(tp)]
            dist.all_gather(parts, local, group=group)
            count = local.shape[split] * tp
            whole = torch.empty(local.shape[:split] + (count,) + local.shape[split + 1:],
                                dtype=local.dtype, device=local.device)
            for r, part in enumerate(parts):
                entries = torch.tensor(rows_of(r, count, blocks, tp), device=local.device)
                whole.index_copy_(split, entries, part)
            local = whole
        state[name] = local.detach().cpu()
    return state


def sliced_step(layer, x, out_features, columns, group, precision) -> dict:
    """equivalence.one_step for a column layer that keeps its own slice of the output: the
    same upstream gradient (seed 0), its columns only; the parameters gathered here."""
    x = x.detach().clone().requires_grad_()
    with autocast(precision, x.device):
        y = layer(x)
    upstream = torch.randn((*x.shape[:-1], out_features),
                           generator=torch.Generator().manual_seed(0))[..., columns]
    y.backward(upstream.to(x.device, y.dtype))
    found = {"output": y.detach().cpu(), "input grad": x.grad.cpu()}
    found.update((f"grad of {name}", value)
                 for name, value in gathered_state(layer, group, grads=True).items())
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    found.update((f"{name} after a step", value)
                 for name, value in gathered_state(layer, group).items())
    return found


def layer_contract(config, ranks, x_bytes, out_bytes):
    """[forward, backward] operations of a layer in a case."""
    if config["tp"] == 1:
        return [[], []]
    if config["layer"] == "column, gathered":
        return [[expected("all_gather", ranks, out_bytes)], [expected("all_reduce", ranks, x_bytes)]]
    if config["layer"] == "column, own slice":
        return [[], [expected("all_reduce", ranks, x_bytes)]]
    return [[expected("all_reduce", ranks, out_bytes)], [expected("all_gather", ranks, x_bytes)]]


def traced_layer(layer, x, precision):
    """Forward and backward of a layer, each traced; (forward calls, backward calls, output)."""
    x = x.detach().clone().requires_grad_()
    with CommTracer() as forward, autocast(precision, x.device):
        y = layer(x)
    with CommTracer() as backward:
        y.backward(torch.ones_like(y))
    return [[call.as_data() for call in trace.calls] for trace in (forward, backward)], y


def one_layer_case(layers, config, seed, group, rank):
    """Before the submission's layer is built: the single-device step and the known mistakes'
    results; then the submission's step and, on a fresh layer, its communication."""
    device = current_device()
    ranks = dist.get_process_group_ranks(group)
    groups = group_layouts(WORLD, config["tp"], seed)[config["layout"]]
    linear, x = layer_and_input(config, group_key(config, seed, groups, rank), device)
    precision = config["dtype"]
    reference = reference_step(linear, x, precision=precision)
    tp_rank = ranks.index(rank)
    mistakes = layer_mistakes(config, linear, x, reference, tp_rank)
    before = parameters_of(linear)
    if config["layer"] == "column, own slice":
        columns = rows_of(tp_rank, linear.out_features, config["blocks"], config["tp"])
        reference = {**reference, "output": reference["output"][..., columns]}
        found = sliced_step(build_layer(layers, config, linear, group), x, linear.out_features,
                            columns, group, precision)
        pairs = [(what, value, reference[what]) for what, value in found.items()]
    else:
        pairs = parallel_pairs(build_layer(layers, config, linear, group), x, reference, group,
                               precision=precision)
    calls, y = traced_layer(build_layer(layers, config, copy.deepcopy(linear), group), x,
                            precision)
    whole = y.numel() * (config["tp"] if config["layer"] == "column, own slice" else 1)
    return {"mistakes": mistakes, "ranks": ranks, "calls": calls,
            "pairs": pairs + source_pairs(linear, before),
            "bytes": (x.numel() * itemsize(x.dtype), whole * compute_bytes(precision))}


def refused(layers, kind, features, options, group):
    try:
        getattr(layers, kind)(nn.Linear(*features), group, **options)
    except ValueError as error:
        return str(error)
    return None


def layers_alone(impl, seed):
    """Every layer case, the zero-weight row layer and the refusals, on every layout."""
    rank, device = dist.get_rank(), current_device()
    groups = make_groups(seed)
    cases = layer_cases(seed)
    torch.manual_seed(seed)
    probe = nn.Linear(6, 5).to(device)
    with torch.no_grad():
        probe.weight.zero_()
    probe_x = numbers(f"{seed}/probe", (3, 7, 6)).to(device)
    expected_bias = probe.bias.detach().cpu().clone()
    layers = impl.module("tp_layers")
    found = {}
    for config in cases:
        group = groups[f"tp {config['tp']}, {config['layout']}"]
        found[label(config, seed)] = attempt(lambda: one_layer_case(layers, config, seed, group,
                                                                    rank))
    pair = groups[f"tp 2, {next(n for tp, n, _ in layouts(seed) if tp == 2)}"]
    found["bias only"] = (attempt(lambda: layers.RowParallelLinear(
        probe, pair, input_is_parallel=False)(probe_x).detach().cpu()), expected_bias)
    found["refusals"] = [refused(layers, *refusal[:3], pair) for refusal in REFUSALS]
    return found



def check_pairs(pairs, rank, where, tolerance, mistakes, blame=None):
    """Every (what, parallel, reference) of a rank, in order, each failure naming its cause
    (``blame``, where a unit is known to be wrong)."""
    for what, parallel, reference in pairs:
        if blame:
            assert_close(parallel, reference, f"{where}: {what}", rank=rank, likely_cause=blame,
                         **tolerance)
        assert_close_naming(parallel, reference, f"{where}: {what}", rank=rank,
                            mistakes=mistakes.get(what, {}), otherwise=likely_cause(what),
                            **tolerance)


def check_layer(rank, config, seed, found):
    kind = "ColumnParallelLinear" if config["layer"].startswith("column") else "RowParallelLinear"
    where = f"{kind} ({config['layer']}) [{label(config, seed)}]"
    assert not isinstance(found, str), f"{where} raised on rank {rank}: {found}"
    wanted = layer_contract(config, found["ranks"], *found["bytes"])
    for phase, calls, operations in zip(("forward", "backward"), found["calls"], wanted):
        check_groups(calls, found["ranks"], f"{where}: the {phase}", rank)
        check_contract(calls, operations, f"{where}: the {phase}", rank=rank,
                       formula=LAYER_FORMULA)
    check_pairs(found["pairs"], rank, where, LAYER_TOLERANCE[config["dtype"]], found["mistakes"])


def test_layers_honour_their_group_on_every_layout(impl, run_on_ranks, sweep_seed):
    check_layers_on_every_layout(run_on_ranks, impl, sweep_seed)


def check_layers_on_every_layout(run_on_ranks, impl, sweep_seed):
    results = run_on_ranks(layers_alone, WORLD, impl, sweep_seed, timeout=TIMEOUT)
    for rank, found in enumerate(results):
        output, bias = found["bias only"]
        assert not isinstance(output, str), (
            f"RowParallelLinear with a zero weight raised on rank {rank}: {output}")
        assert_close_naming(
            output, bias.expand_as(output), "RowParallelLinear's output with a zero weight",
            rank=rank, atol=1e-5, against="the layer's bias",
            otherwise="with a zero weight the output is the bias, once",
            mistakes={BIAS_BEFORE_THE_REDUCE: 2 * bias.expand_as(output)})
        for (kind, features, options, message), error in zip(REFUSALS, found["refusals"]):
            assert error is not None and message in error, (
                f"rank {rank}: {kind}(nn.Linear{features}, a group of 2, {options}) gave "
                f"{error!r}; it must refuse with a ValueError saying {message!r}")
    for config in layer_cases(sweep_seed):
        for rank, found in enumerate(results):
            check_layer(rank, config, sweep_seed, found[label(config, sweep_seed)])


# ----------------------------------------------------------------- 4. compositions

INTO_SHARDS, AROUND_MLP, TWO_LAYERS = ("fc2(gelu(fc1(x) + f(x)))", "x + ParallelMLP(x)",
                                       "col1(x) + col2(x)")
COMPOSITIONS = {
    INTO_SHARDS: ("a residual into the shards: f's output is an operand of an add, whose "
                  "gradient tensor is fc1's output gradient too",
                  "forward one all-reduce (fc2's g); backward two all-reduces of the input "
                  "gradient (fc1's f and the residual's f)"),
    AROUND_MLP: ("a residual around the TP MLP",
                 "forward one all-reduce (after fc2); backward one all-reduce of the input "
                 "gradient (f before fc1)"),
    TWO_LAYERS: ("one input used by two column-parallel layers, gathered, then added",
                 "forward an all-gather of each layer's whole output; backward one all-reduce "
                 "of the input gradient per layer"),
}
HIDDEN = 4


class Composition(nn.Module):
    """The compositions, single-device (``copy`` None) or TP (``copy`` = copy_to_tp); the parts
    carry the same names in both, so that their parameters pair up."""

    def __init__(self, name, tp, group=None, copy=None, **parts):
        super().__init__()
        self.name, self.tp, self.group, self.copy = name, tp, group, copy
        for key, part in parts.items():
            setattr(self, key, part)

    def forward(self, x):
        if self.name == INTO_SHARDS:
            hidden = self.fc1(x)  # built first: the residual's f is reached first in backward
            residual = (torch.cat([x] * self.tp, -1) if self.copy is None
                        else self.copy(x, self.group))
            return self.fc2(F.gelu(hidden + residual))
        if self.name == AROUND_MLP:
            return x + self.mlp(x)
        return self.col1(x) + self.col2(x)


def single_device_parts(name, tp):
    if name == INTO_SHARDS:
        return {"fc1": nn.Linear(HIDDEN, tp * HIDDEN), "fc2": nn.Linear(tp * HIDDEN, 3)}
    if name == AROUND_MLP:
        return {"mlp": MLP(HIDDEN, 2 * tp)}
    return {"col1": nn.Linear(HIDDEN, 2 * tp), "col2": nn.Linear(HIDDEN, 2 * tp)}


def tp_parts(layers, name, single, group):
    if name == INTO_SHARDS:
        return {"fc1": layers.ColumnParallelLinear(single.fc1, group),
                "fc2": layers.RowParallelLinear(single.fc2, group, input_is_parallel=True)}
    if name == AROUND_MLP:
        return {"mlp": layers.ParallelMLP(single.mlp, group)}
    return {key: layers.ColumnParallelLinear(getattr(single, key), group, gather_output=True)
            for key in ("col1", "col2")}


def composition_cases(seed: int) -> list[dict]:
    return [{"tp": tp, "layout": layout, "composition": name, "dtype": dtype}
            for tp, layout, _ in layouts(seed) if tp > 1
            for name in COMPOSITIONS for dtype in DTYPES]


def composition_contract(config, ranks, x_bytes, out_bytes):
    reduce_x = expected("all_reduce", ranks, x_bytes)
    if config["composition"] == INTO_SHARDS:
        return [[expected("all_reduce", ranks, out_bytes)], [reduce_x, reduce_x]]
    if config["composition"] == AROUND_MLP:
        return [[expected("all_reduce", ranks, out_bytes)], [reduce_x]]
    gather = expected("all_gather", ranks, out_bytes)
    return [[gather, gather], [reduce_x, reduce_x]]


def one_composition(impl, config, seed, group, rank):
    device, name, tp = current_device(), config["composition"], config["tp"]
    groups = group_layouts(WORLD, tp, seed)[config["layout"]]
    key = group_key(config, seed, groups, rank)
    torch.manual_seed(zlib.crc32(key.encode()) % 2**31)
    single = Composition(name, tp, **single_device_parts(name, tp)).to(device)
    x = numbers(f"{key}/x", (BATCH, SEQ, HIDDEN)).to(device)
    reference = reference_step(single, x, precision=config["dtype"])
    before = parameters_of(single)
    layers, copy_to_tp = impl.module("tp_layers"), impl.module("tp_collectives").copy_to_tp

    def parallel():
        return Composition(name, tp, group, copy_to_tp, **tp_parts(layers, name, single, group))

    pairs = (parallel_pairs(parallel(), x, reference, group, precision=config["dtype"])
             + source_pairs(single, before))
    single = copy.deepcopy(single)  # a traced run apart: pairs are not touched by it
    calls, y = traced_layer(parallel(), x, config["dtype"])
    return {"pairs": pairs, "calls": calls, "ranks": dist.get_process_group_ranks(group),
            "bytes": (x.numel() * itemsize(x.dtype), y.numel() * compute_bytes(config["dtype"]))}


def copy_changes_its_incoming_gradient(impl, group) -> bool:
    """Whether the submission's copy_to_tp changes the gradient tensor handed to its backward."""
    x = torch.ones(3, device=current_device()).requires_grad_()
    upstream = torch.ones(3, device=x.device)
    impl.module("tp_collectives").copy_to_tp(x, group).backward(upstream)
    return not bool((upstream == 1).all())


def compositions(impl, seed):
    rank = dist.get_rank()
    groups = make_groups(seed)
    found = {}
    for config in composition_cases(seed):
        group = groups[f"tp {config['tp']}, {config['layout']}"]
        found[label(config, seed)] = attempt(lambda: one_composition(impl, config, seed, group,
                                                                     rank))
    world = groups[f"tp {WORLD}, world"]
    found["copy changes its incoming gradient"] = copy_changes_its_incoming_gradient(impl, world)
    return found


def check_composition(rank, config, seed, found, in_place):
    name = config["composition"]
    where = f"the composition {name}, {COMPOSITIONS[name][0]} [{label(config, seed)}]"
    assert not isinstance(found, str), f"{where} raised on rank {rank}: {found}"
    for phase, calls in zip(("forward", "backward"), found["calls"]):
        check_groups(calls, found["ranks"], f"{where}: the {phase}", rank)
    check_pairs(found["pairs"], rank, where, LAYER_TOLERANCE[config["dtype"]], {},
                blame=IN_PLACE if in_place else None)
    wanted = composition_contract(config, found["ranks"], *found["bytes"])
    for phase, calls, operations in zip(("forward", "backward"), found["calls"], wanted):
        check_contract(calls, operations, f"{where}: the {phase}", rank=rank,
                       formula=COMPOSITIONS[name][1])


def test_compositions_with_shared_gradients_match_single_device(impl, run_on_ranks, sweep_seed):
    check_compositions(run_on_ranks, impl, sweep_seed)


def check_compositions(run_on_ranks, impl, sweep_seed):
    results = run_on_ranks(compositions, WORLD, impl, sweep_seed, timeout=TIMEOUT)
    for config in composition_cases(sweep_seed):
        for rank, found in enumerate(results):
            check_composition(rank, config, sweep_seed, found[label(config, sweep_seed)],
                              found["copy changes its incoming gradient"])
