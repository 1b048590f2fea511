"""Lab 2, graded: what ``shard`` promises besides its values (``reference_impl.course.contracts``:
each property checked on the submission against itself).

``shard`` leaves the whole tensor as it was, gives its piece in the tensor's dtype (float64,
bfloat16, int64) and on its device whatever the default device, names a dimension counted
from the end as the same dimension counted from the front, and gives a new tensor (writing into
it leaves the whole as it was).

``ColumnParallelLinear`` and ``RowParallelLinear`` take a linear layer without a bias (an
optional part absent): on 2 ranks, built from ``nn.Linear(6, 8, bias=False)`` and
``nn.Linear(8, 6, bias=False)``, they hold no bias, and the output, the input gradient and each
weight's gradient shard are one device's (atol = rtol = 1e-5).

Draws: 4 x 6, 6 x 4 and 2 x 6 x 4 tensors cut in 2 and 3 along each dimension that divides, in
1 and 2 blocks. The hidden tier draws other shapes.
"""
import copy

import pytest
import torch
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.comm.rank_failures import RankFailure
from reference_impl.course.contracts import (
    FollowsDevice, FollowsDtype, ReadsOnly, Relation, assert_contract, differs)

pytestmark = pytest.mark.lab2


def shard_draws(seed: int, shapes=((4, 6), (6, 4), (2, 6, 4))) -> dict[str, tuple]:
    generator = torch.Generator().manual_seed(seed)
    draws = {}
    for shape in shapes:
        full = torch.randn(*shape, generator=generator)
        for dim, size in enumerate(shape):
            for tp in (2, 3):
                for blocks in (1, 2):
                    if size % (tp * blocks) == 0:
                        rank = (seed + dim) % tp
                        draws[f"{'x'.join(map(str, shape))} along {dim}, rank {rank} of {tp}, "
                              f"{blocks} block(s)"] = (full, dim, rank, tp, blocks)
    return draws


def counted_from_the_end(shard, args) -> tuple:
    full, dim, rank, tp, blocks = args
    return (shard(full, dim - full.dim(), rank, tp, blocks), shard(full, dim, rank, tp, blocks))


def integers(shard, args) -> tuple:
    full, *rest = args
    return str(shard((full * 100).long(), *rest).dtype), str(torch.int64)


def a_new_tensor(shard, args) -> tuple:
    full, *rest = args
    before = full.clone()
    shard(full, *rest).add_(1)
    return full, before


SHARD = (ReadsOnly(), FollowsDtype(torch.float64), FollowsDtype(torch.bfloat16), FollowsDevice(),
         Relation("keeps an integer tensor's dtype", integers),
         Relation("takes a dimension counted from the end as the same dimension",
                  counted_from_the_end),
         Relation("gives a new tensor: writing into it leaves the whole tensor as it was",
                  a_new_tensor))


def test_shard_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "tp_layers", "shard", SHARD, shard_draws(sweep_seed))


def layers_without_bias(impl, seed: int):
    """A column- then a row-parallel layer built from linear layers without a bias, forward and
    backward on this rank, and the same on one device (computed before the submission runs)."""
    device = current_device()
    torch.manual_seed(seed)
    first, second = nn.Linear(6, 8, bias=False).to(device), nn.Linear(8, 6, bias=False).to(device)
    x = torch.randn(3, 6, device=device, requires_grad=True)
    out = second(first(x))
    out.pow(2).sum().backward()
    expected = {"x": x.grad.cpu(), "first": first.weight.grad.cpu(), "second": second.weight.grad.cpu(),
                "out": out.detach().cpu()}
    layers = impl.module("tp_layers")
    column = layers.ColumnParallelLinear(copy.deepcopy(first))
    row = layers.RowParallelLinear(copy.deepcopy(second))
    x = x.detach().clone().requires_grad_()
    out = row(column(x))
    out.pow(2).sum().backward()
    found = {"x": x.grad.cpu(), "out": out.detach().cpu(),
             "first": column.weight.grad.cpu(), "second": row.weight.grad.cpu(),
             "biases": [column.bias is None, row.bias is None]}
    return {"expected": expected, "found": found}


def test_layers_without_a_bias_keep_their_contract(impl, run_on_ranks, sweep_seed):
    """An optional part absent: the layers are built from linear layers without a bias."""
    try:
        results = run_on_ranks(layers_without_bias, 2, impl, sweep_seed)
    except RankFailure as error:
        raise AssertionError(f"ColumnParallelLinear and RowParallelLinear break their contract that "
                             f"they take a linear layer without a bias: {error.summary}") from None
    for rank, result in enumerate(results):
        found, expected = result["found"], result["expected"]
        assert found["biases"] == [True, True], (
            f"rank {rank}: built from layers without a bias, the parallel layers hold a bias "
            f"(column, row: {['none' if none else 'a tensor' for none in found['biases']]})")
        for name in ("out", "x"):
            where = differs(found[name], expected[name], atol=1e-5, rtol=1e-5)
            assert where is None, (f"rank {rank}: without a bias, the layers' "
                                   f"{'output' if name == 'out' else 'input gradient'} differs from "
                                   f"one device's: {where}")
        mine = slice(rank * 4, (rank + 1) * 4)  # this rank's 4 of the 8 hidden features
        for name, shard in (("first", expected["first"][mine]), ("second", expected["second"][:, mine])):
            where = differs(found[name], shard, atol=1e-5, rtol=1e-5)
            assert where is None, (f"rank {rank}: without a bias, the {name} layer's weight gradient "
                                   f"is not its shard of one device's: {where}")
