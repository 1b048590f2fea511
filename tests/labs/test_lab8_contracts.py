"""Lab 8, graded: what the merge and the positions promise besides their values
(``reference_impl.course.contracts``: each property checked on the submission against itself).

* ``merge_partials`` leaves its inputs as they were (in ring attention they are views of the
  running output), gives float64 results for float64 inputs, places what it makes on its
  inputs' device, does not depend on which block comes first, is left as it is by a block that
  sees no key (out 0, lse -inf), and treats each query row on its own (rows permuted in,
  permuted out). Tolerance: 1e-6 absolute, 1e-5 relative (the two calls differ in the order of
  their sums only).
* ``token_positions`` puts its result on the device asked for, whatever the default device.

Draws: batch 2, heads 3, 5 queries, head_dim 4, scores of randn size and lifted by 90, with
some rows of the second block seeing no key; the hidden tier draws other shapes and seeds.
"""
import pytest
import torch

from reference_impl.course.contracts import (
    FollowsDevice, FollowsDtype, ReadsOnly, Relation, assert_contract)

pytestmark = pytest.mark.lab8


def merge_draws(seed: int, shape=(2, 3, 5, 4)) -> dict[str, tuple]:
    """(out1, lse1, out2, lse2) of two blocks: float32, some rows of block 2 seeing no key."""
    draws = {}
    for lift in (0.0, 90.0):
        generator = torch.Generator().manual_seed(seed * 101 + int(lift))
        out1, out2 = (torch.randn(*shape, generator=generator) for _ in range(2))
        lse1, lse2 = (torch.randn(*shape[:-1], generator=generator) + lift for _ in range(2))
        lse2[0, 0, :2] = float("-inf")
        out2[0, 0, :2] = 0.0
        draws[f"shape {'x'.join(map(str, shape))}, lse near {lift:g}, seed {seed}"] = (
            out1, lse1, out2, lse2)
    return draws


def either_order(merge, args) -> tuple:
    out1, lse1, out2, lse2 = args
    return (merge(out2, lse2, out1, lse1), merge(out1, lse1, out2, lse2))


def empty_block(merge, args) -> tuple:
    out1, lse1, _, _ = args
    nothing = torch.full_like(lse1, float("-inf"))
    return (merge(out1, lse1, torch.zeros_like(out1), nothing), (out1, lse1))


def rows_apart(merge, args) -> tuple:
    order = torch.randperm(args[1].shape[-1], generator=torch.Generator().manual_seed(1))
    permuted = [each[:, :, order] for each in args]
    out, lse = merge(*args)
    return (merge(*permuted), (out[:, :, order], lse[:, :, order]))


MERGE = (ReadsOnly(), FollowsDtype(torch.float64), FollowsDevice(),
         Relation("does not depend on which block comes first", either_order),
         Relation("is left as it is by a block that sees no key", empty_block),
         Relation("treats each query row on its own (rows permuted, results permuted)",
                  rows_apart))


def positions_on(token_positions, args) -> tuple:
    with torch.device("meta"):
        found = token_positions(*args, device="cpu")
    return str(found.device), "cpu"


POSITIONS = (Relation("puts its result on the device asked for, whatever the default device",
                      positions_on),)


def test_merge_partials_keeps_its_contract(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "online_softmax", "merge_partials", MERGE,
                    merge_draws(sweep_seed))


def test_token_positions_keeps_its_contract(impl, run_alone):
    assert_contract(run_alone, impl, "load_balance", "token_positions", POSITIONS,
                    {"seq 8, cp 2, rank 1": (8, 2, 1), "seq 12, cp 3, rank 0": (12, 3, 0)})
