"""Lab 2, graded: what ``shard`` promises besides its values (``reference_impl.course.contracts``:
each property checked on the submission against itself).

``shard`` leaves the whole tensor as it was, gives its piece in the tensor's dtype (float64,
bfloat16, int64) and on its device whatever the default device, names a dimension counted
from the end as the same dimension counted from the front, and gives a new tensor (writing into
it leaves the whole as it was).

Draws: 4 x 6, 6 x 4 and 2 x 6 x 4 tensors cut in 2 and 3 along each dimension that divides, in
1 and 2 blocks. The hidden tier draws other shapes.
"""
import pytest
import torch

from reference_impl.course.contracts import (
    FollowsDevice, FollowsDtype, ReadsOnly, Relation, assert_contract)

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
