"""Lab 2, graded: Megatron's autograd collectives, the column- and row-parallel linear layers
and the TP MLP, each against its single-device original.

Tolerances (fp32): the TP layers only change the order of additions, so outputs, gradients and
weights after a step agree to atol 1e-5 (observed: a few 1e-7); the collectives alone are
checked to 1e-6.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close, assert_close_naming
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.equivalence import (assert_equivalent, parallel_pairs, parameters_of,
                                        reference_step, source_pairs)
from reference_impl.comm.device import current_device
from reference_impl.model import MLP


pytestmark = pytest.mark.lab2

ATOL = 1e-5


SHAPE = (3, 4)
PAIRS = [[0, 1], [2, 3]]  # two TP groups of 2 at once, in a world of 4


def per_rank_tensor(shape, rank, requires_grad=True):
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(shape, generator=generator).requires_grad_(requires_grad)


def through_pair(impl, name):
    """Send rank r's own x_r through the collective, backward with rank r's own g_r: once over
    the whole world (group None), once over this rank's group of two. (y, x.grad) each."""
    rank, device = dist.get_rank(), current_device()
    pair_groups = [dist.new_group(ranks) for ranks in PAIRS]  # every rank creates every group
    collective = getattr(impl.module("tp_collectives"), name)
    results = []
    for group in (None, pair_groups[rank // 2]):
        x = per_rank_tensor(SHAPE, rank, requires_grad=False).to(device).requires_grad_()
        y = collective(x, group)
        y.backward(per_rank_tensor(SHAPE, 50 + rank, requires_grad=False).to(device))
        results.append((y.detach(), x.grad))
    return results


def members(rank):
    """(which, the ranks of rank's group) for the two groups through_pair uses."""
    return [("whole world", range(4)), ("its group of two", PAIRS[rank // 2])]


def inputs(ranks):
    return sum(per_rank_tensor(SHAPE, r, False) for r in ranks)


def upstreams(ranks):
    return sum(per_rank_tensor(SHAPE, 50 + r, False) for r in ranks)


def test_copy_to_tp_is_identity_forward_all_reduce_backward(impl, run_on_ranks):
    for rank, results in enumerate(run_on_ranks(through_pair, 4, impl, "copy_to_tp")):
        for (which, ranks), (output, input_grad) in zip(members(rank), results):
            assert_close(output, per_rank_tensor(SHAPE, rank, False),
                         f"copy_to_tp's output over the {which}", rank=rank, atol=1e-6,
                         likely_cause="the forward must return x unchanged")
            assert_close_naming(
                input_grad, upstreams(ranks), f"copy_to_tp's input gradient over the {which}",
                rank=rank, atol=1e-6, otherwise="the backward must all-reduce (sum) the gradient "
                "over the group it is given",
                mistakes={COPY_BACKWARD_NOT_REDUCED: per_rank_tensor(SHAPE, 50 + rank, False),
                          WRONG_GROUP: upstreams(range(4))})


def test_reduce_from_tp_is_all_reduce_forward_identity_backward(impl, run_on_ranks):
    for rank, results in enumerate(run_on_ranks(through_pair, 4, impl, "reduce_from_tp")):
        for (which, ranks), (output, input_grad) in zip(members(rank), results):
            assert_close_naming(
                output, inputs(ranks), f"reduce_from_tp's output over the {which}", rank=rank,
                atol=1e-6, otherwise="the forward must all-reduce (sum) x over the group",
                mistakes={WRONG_GROUP: inputs(range(4))})
            assert_close_naming(
                input_grad, per_rank_tensor(SHAPE, 50 + rank, False),
                f"reduce_from_tp's input gradient over the {which}", rank=rank, atol=1e-6,
                otherwise="the backward must pass the gradient on unchanged",
                mistakes={REDUCE_BACKWARD_REDUCED: upstreams(ranks)})


COPY_BACKWARD_NOT_REDUCED = (
    "copy_to_tp's backward does not all-reduce: each rank keeps only its own shard's part of "
    "the input gradient, while x fed every rank's shard (f's backward sums over the group)")
REDUCE_BACKWARD_REDUCED = (
    "reduce_from_tp's backward all-reduces too: the gradient of a sum reaches every addend "
    "unchanged, and every rank already holds it; summed again, it is counted tp times "
    "(g's backward is the identity)")
WRONG_GROUP = ("the collective ran over the whole world, not over the group it was given: "
               "pass the group to torch.distributed")
CONTIGUOUS_SPLIT = (
    "the fused blocks were split as one contiguous tensor: with blocks=3 (a fused [q; k; v]) "
    "each block is split in tp on its own, and rank r keeps piece r of every block")


def shards_of_numbered_rows(impl):
    """shard() of a tensor whose entry is its own row number, for several layouts; and the
    shard again after the full tensor was changed (a view would change with it)."""
    shard = impl.module("tp_layers").shard
    results = {}
    for rows, dim, tp, blocks in LAYOUTS:
        full = torch.arange(rows, dtype=torch.float32).repeat(5, 1)  # (5, rows): dim 1
        if dim == 0:
            full = full.T.contiguous()  # (rows, 5)
        results[(dim, tp, blocks)] = [shard(full, dim, rank, tp, blocks) for rank in range(tp)]
        full.add_(1000.0)
        results[(dim, tp, blocks)].append(shard(full, dim, 0, tp, blocks) - 1000.0)
    return {f"{key}": value for key, value in results.items()}


LAYOUTS = [(12, 0, 2, 3), (12, 1, 2, 3), (24, 0, 4, 3), (8, 0, 4, 1), (12, 1, 3, 2)]


def test_shard_keeps_piece_r_of_every_block(impl, run_alone):
    results = run_alone(shards_of_numbered_rows, impl)
    for rows, dim, tp, blocks in LAYOUTS:
        *shards, moved = results[f"{(dim, tp, blocks)}"]
        block, piece = rows // blocks, rows // blocks // tp
        for rank, local in enumerate(shards):
            kept = torch.tensor([b * block + rank * piece + i
                                 for b in range(blocks) for i in range(piece)], dtype=torch.float32)
            expected = kept.repeat(5, 1) if dim == 1 else kept.repeat(5, 1).T
            contiguous = torch.arange(rows, dtype=torch.float32).chunk(tp)[rank]
            assert_close_naming(
                local, expected, f"shard(dim={dim}, tp={tp}, blocks={blocks})", rank=rank,
                atol=0, against="the rows of this rank's pieces, block by block",
                otherwise=f"rank r keeps piece r of each of the {blocks} blocks along dim {dim}",
                mistakes={CONTIGUOUS_SPLIT: contiguous.repeat(5, 1) if dim == 1
                          else contiguous.repeat(5, 1).T})
        assert torch.equal(moved, shards[0]), (
            f"shard(dim={dim}, tp={tp}, blocks={blocks}) changed when the full tensor was "
            "changed afterwards: it returns a view of the full tensor; a shard must be a tensor "
            "of its own (the parameter is trained on its own)")


def linear_pairs(impl, kind, in_features, out_features, **options):
    device = current_device()
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features).to(device)
    x = torch.randn(2, 5, in_features).to(device)
    expected = reference_step(linear, x)
    parallel = getattr(impl.module("tp_layers"), kind)(linear, **options)
    return parallel_pairs(parallel, x, expected)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_column_parallel_linear_with_gathered_output(impl, run_on_ranks, world_size):
    assert_equivalent(run_on_ranks(linear_pairs, world_size, impl, "ColumnParallelLinear", 6, 8,
                                   gather_output=True), atol=ATOL)


def column_slice(impl, in_features, out_features):
    device = current_device()
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features).to(device)
    x = torch.randn(2, 5, in_features).to(device)
    n, rank = dist.get_world_size(), dist.get_rank()
    expected = linear(x).detach().chunk(n, dim=-1)[rank]
    parallel = impl.module("tp_layers").ColumnParallelLinear(linear)
    return parallel(x).detach(), expected


def test_column_parallel_linear_keeps_its_slice_of_the_output(impl, run_on_ranks):
    for rank, (local, expected) in enumerate(run_on_ranks(column_slice, 2, impl, 6, 8)):
        assert_close(local, expected, "ColumnParallelLinear's output (gather_output=False)",
                     rank=rank, atol=ATOL, likely_cause="rank r must compute output columns "
                     "r*out/tp to (r+1)*out/tp, and not gather them")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_row_parallel_linear_splitting_its_input(impl, run_on_ranks, world_size):
    assert_equivalent(run_on_ranks(linear_pairs, world_size, impl, "RowParallelLinear", 8, 6,
                                   input_is_parallel=False), atol=ATOL)


def mlp_pairs(impl, hidden):
    device = current_device()
    torch.manual_seed(0)
    mlp = MLP(hidden, 4 * hidden).to(device)
    x = torch.randn(3, 5, hidden).to(device)
    expected = reference_step(mlp, x)
    return parallel_pairs(impl.module("tp_layers").ParallelMLP(mlp), x, expected)


@pytest.mark.parametrize("world_size, hidden", [(1, 8), (2, 8), (4, 16)])
def test_tp_mlp_matches_the_single_device_mlp(impl, run_on_ranks, world_size, hidden):
    assert_equivalent(run_on_ranks(mlp_pairs, world_size, impl, hidden), atol=ATOL)


def mlp_collectives(impl):
    device = current_device()
    torch.manual_seed(0)
    mlp = impl.module("tp_layers").ParallelMLP(MLP(8, 32).to(device))
    x = torch.randn(2, 5, 8).to(device).requires_grad_()
    with CommTracer() as forward:
        y = mlp(x)
    with CommTracer() as backward:
        y.sum().backward()
    return forward.summary(), backward.summary()


def test_tp_mlp_does_one_all_reduce_each_way(impl, run_on_ranks):
    for rank, (forward, backward) in enumerate(run_on_ranks(mlp_collectives, 2, impl)):
        assert forward == {"all_reduce": 1}, (
            f"rank {rank}: the TP MLP's forward ran {forward}; Megatron's runs one all-reduce "
            "(after fc2), none between fc1 and fc2")
        assert backward == {"all_reduce": 1}, (
            f"rank {rank}: the TP MLP's backward ran {backward}; Megatron's runs one all-reduce "
            "(of the input gradient, in copy_to_tp before fc1)")


BIAS_BEFORE_THE_REDUCE = (
    "the row-parallel bias was added on every rank before the all-reduce: the sum then counts "
    "it tp times; the whole bias belongs to the sum, added once, after reduce_from_tp")


REFUSALS = [("ColumnParallelLinear", (6, 5), {}, "output features 5 is not divisible by the "
              "tensor-parallel size tp = 2"),
             ("ColumnParallelLinear", (6, 9), {"blocks": 3}, "output features per block (3 "
              "blocks) 3 is not divisible"),
             ("RowParallelLinear", (5, 6), {}, "input features 5 is not divisible by the "
              "tensor-parallel size tp = 2")]


def refused(layers, kind, features, options, group):
    try:
        getattr(layers, kind)(nn.Linear(*features), group, **options)
    except ValueError as error:
        return str(error)
    return None


def layers_on_two_groups(impl):
    """World of 4, two TP groups of 2 at once; features that divide by 2 but not by 4 (6 and 18;
    the row layer's 5 outputs need not divide). A row-parallel layer whose weight is zero (its
    output is then the bias alone), each layer and the MLP against its single-device original
    (and the original itself after the parallel step), and the sizes a layer must refuse."""
    device, rank = current_device(), dist.get_rank()
    groups = [dist.new_group(ranks) for ranks in PAIRS]
    group = groups[rank // 2]
    torch.manual_seed(0)
    probe = nn.Linear(6, 5).to(device)
    with torch.no_grad():
        probe.weight.zero_()
    modules = {"column": nn.Linear(6, 6).to(device), "row": nn.Linear(6, 5).to(device),
               "mlp": MLP(6, 18).to(device)}
    x = torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(rank // 2)).to(device)
    expected_bias = probe.bias.detach().clone()
    expected = {kind: reference_step(module, x) for kind, module in modules.items()}
    before = {kind: parameters_of(module) for kind, module in modules.items()}

    layers = impl.module("tp_layers")
    bias_only = layers.RowParallelLinear(probe, group, input_is_parallel=False)(x).detach()
    parallel = {"column": layers.ColumnParallelLinear(modules["column"], group, gather_output=True),
                "row": layers.RowParallelLinear(modules["row"], group, input_is_parallel=False),
                "mlp": layers.ParallelMLP(modules["mlp"], group)}
    found = {"bias only": (bias_only, expected_bias),
             "refusals": [refused(layers, *refusal[:3], group) for refusal in REFUSALS]}
    for kind, layer in parallel.items():
        found[kind] = (parallel_pairs(layer, x, expected[kind], group)
                       + source_pairs(modules[kind], before[kind]))
    return found


def test_layers_honour_their_group_with_two_groups_at_once(impl, run_on_ranks):
    results = run_on_ranks(layers_on_two_groups, 4, impl)
    for rank, checks in enumerate(results):
        output, bias = checks["bias only"]
        assert_close_naming(
            output, bias.expand_as(output), "RowParallelLinear's output with a zero weight",
            rank=rank, atol=ATOL, against="the layer's bias",
            otherwise="with a zero weight the output is the bias, once",
            mistakes={BIAS_BEFORE_THE_REDUCE: 2 * bias.expand_as(output)})
        for (kind, features, options, message), error in zip(REFUSALS, checks["refusals"]):
            assert error is not None and message in error, (
                f"rank {rank}: {kind}(nn.Linear{features}, a group of 2, {options}) gave "
                f"{error!r}; it must refuse with a ValueError saying {message!r}")
    for kind in ("column", "row", "mlp"):
        try:
            assert_equivalent([checks[kind] for checks in results], atol=ATOL)
        except AssertionError as failure:
            raise AssertionError(f"{kind}, TP groups [0, 1] and [2, 3] at once: {failure}") from None
