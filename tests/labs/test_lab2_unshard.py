"""Lab 2, graded: a rank's shard as a parameter (``sharded_parameter``) and its inverse
(``unshard``), on two TP groups of two at once, [0, 1] and [2, 3], in a world of four.

The tensors are numbered: entry i along the split dimension holds i, so the right answer is a
list of row numbers and a wrong one shows where its rows came from. Every expected value is
computed here, from the numbers, not by the submission; unshard is given shards and marks made
by this file, so that it is graded on its own.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close, assert_close_naming
from reference_impl.comm.device import current_device

pytestmark = pytest.mark.lab2

PAIRS = [[0, 1], [2, 3]]
TP = 2
LAYOUTS = [(12, 0, 3), (6, 1, 1), (8, 0, 2)]  # rows along dim, dim, blocks; 6 is not 4's multiple
MOVED = 1000.0  # added to the full tensor after sharding: a view of it would move too

WORLD_RANK = ("the piece was chosen by the rank in the world, not in the group: ranks 2 and 3 "
              "are ranks 0 and 1 of their group [2, 3] and hold what ranks 0 and 1 hold "
              "(dist.get_rank(group))")
WORLD_SIZE = ("the shard has fewer rows than tp = 2 gives: tp was taken as the world's size (4), "
              "not the group's (dist.get_world_size(group))")
NO_BLOCKS = ("the blocks were not passed on: the fused tensor was cut into tp contiguous pieces, "
             "not each of its blocks on its own")
A_VIEW = ("the parameter shares memory with the full tensor (it moved when the full tensor was "
          "changed): a shard is a tensor of its own")
RANK_MAJOR = ("the gathered parts were joined rank by rank: each rank's part holds its piece of "
              "every block, so the blocks were not put back in order (block by block, each block "
              "every rank's piece)")
OVER_THE_WORLD = ("the parts were gathered over the world (4 ranks), not over the group of two it "
                  "was given")
REPLICATED_GATHERED = ("a parameter without tp_dim was gathered: it is whole on every rank "
                       "already and must come back as it is")


def numbered(rows, dim):
    """Entry i along ``dim`` holds i (5 entries across)."""
    full = torch.arange(rows, dtype=torch.float32).repeat(5, 1)  # (5, rows)
    return full if dim == 1 else full.T.contiguous()


def rows_of(rank, rows, blocks, tp):
    """The row numbers rank ``rank`` of ``tp`` holds: piece ``rank`` of every block."""
    block, piece = rows // blocks, rows // blocks // tp
    return [b * block + rank * piece + i for b in range(blocks) for i in range(piece)]


def rows(full, dim, numbers):
    return full.index_select(dim, torch.tensor(numbers, device=full.device))


def attempt(call):
    try:
        return call()
    except Exception as error:  # reported by the test, with the rank it happened on
        return f"{type(error).__name__}: {error}"


def described(parameter, full):
    full.add_(MOVED)
    return {"value": parameter.detach().cpu().clone(), "parameter": isinstance(parameter, nn.Parameter),
            "leaf": parameter.is_leaf, "tp_dim": getattr(parameter, "tp_dim", None),
            "tp_blocks": getattr(parameter, "tp_blocks", None)}


def shards_and_full_tensors(impl):
    rank, device = dist.get_rank(), current_device()
    group = [dist.new_group(ranks) for ranks in PAIRS][rank // 2]
    fulls, marked = [], []
    for count, dim, blocks in LAYOUTS:  # before the submission: its inputs
        full = numbered(count, dim).to(device)
        local = nn.Parameter(rows(full, dim, rows_of(rank % TP, count, blocks, TP)))
        local.tp_dim, local.tp_blocks = dim, blocks
        fulls.append(full)
        marked.append(local)
    replicated = nn.Parameter(torch.arange(5.0, device=device))

    layers = impl.module("tp_layers")
    found = {"unshard": [attempt(lambda p=p: layers.unshard(p.detach(), p, group).cpu())
                         for p in marked + [replicated]]}
    found["sharded_parameter"] = [
        attempt(lambda: described(layers.sharded_parameter(full, dim, group, blocks), full))
        for full, (_, dim, blocks) in zip(fulls, LAYOUTS)]
    return found


def check_sharded_parameter(results):
    for index, (count, dim, blocks) in enumerate(LAYOUTS):
        what = f"sharded_parameter(rows={count}, dim={dim}, blocks={blocks}) over [0, 1] and [2, 3]"
        expected = [rows(numbered(count, dim), dim, rows_of(r % TP, count, blocks, TP))
                    for r in range(4)]
        made = [found["sharded_parameter"][index] for found in results]
        wrong = [r for r in range(4) if isinstance(made[r], str)
                 or not torch.equal(made[r]["value"], expected[r])]
        if wrong == [2, 3]:
            shown = made[2] if isinstance(made[2], str) else made[2]["value"].tolist()
            raise AssertionError(f"{what}: ranks 0 and 1 are right, ranks 2 and 3 are not "
                                 f"(rank 2: {shown}). Likely cause: {WORLD_RANK}")
        for rank in range(4):
            if isinstance(made[rank], str):
                raise AssertionError(f"{what} raised on rank {rank}: {made[rank]}")
            value = made[rank]["value"]
            fewer = value.dim() == 2 and value.shape[dim] < expected[rank].shape[dim]
            assert_close_naming(value, expected[rank], what, rank=rank, atol=0,
                                against="piece r of every block, r the rank in the group",
                                mistakes={A_VIEW: expected[rank] + MOVED, NO_BLOCKS: rows(
                                    numbered(count, dim), dim, rows_of(rank % TP, count, 1, TP))},
                                otherwise=WORLD_SIZE if fewer else
                                "rank r of the group keeps piece r of every block")
            marks = (made[rank]["parameter"], made[rank]["leaf"], made[rank]["tp_dim"],
                     made[rank]["tp_blocks"])
            assert marks == (True, True, dim, blocks), (
                f"{what} on rank {rank}: (an nn.Parameter, a leaf, tp_dim, tp_blocks) = {marks}, "
                f"expected (True, True, {dim}, {blocks}): a shard is a parameter trained on its "
                "own, marked with the dimension and the blocks that unshard reads")


def check_unshard(results):
    for index, (count, dim, blocks) in enumerate(LAYOUTS):
        what = f"unshard(rows={count}, dim={dim}, blocks={blocks}) over [0, 1] and [2, 3]"
        full = numbered(count, dim)
        joined = torch.cat([rows(full, dim, rows_of(r, count, blocks, TP)) for r in range(TP)], dim)
        for rank, found in enumerate(results):
            value = found["unshard"][index]
            if isinstance(value, str):
                raise AssertionError(f"{what} raised on rank {rank}: {value}")
            doubled = value.dim() == 2 and value.shape[dim] == 2 * count
            assert_close_naming(value, full, what, rank=rank, atol=0, against="the full tensor",
                                mistakes={RANK_MAJOR: joined} if blocks > 1 else {},
                                otherwise=OVER_THE_WORLD if doubled else
                                "the full tensor lists block by block, each block every rank's piece")
    for rank, found in enumerate(results):
        value = found["unshard"][-1]
        if isinstance(value, str):
            raise AssertionError(f"unshard of a replicated parameter raised on rank {rank}: {value}")
        assert_close(value, torch.arange(5.0), "unshard of a replicated parameter (no tp_dim)",
                     rank=rank, atol=0, against="the parameter as it is",
                     likely_cause=REPLICATED_GATHERED if value.numel() > 5 else "")


def test_sharded_parameter_and_unshard_on_two_groups_at_once(impl, run_on_ranks):
    results = run_on_ranks(shards_and_full_tensors, 4, impl)
    check_unshard(results)
    check_sharded_parameter(results)
