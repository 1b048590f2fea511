"""Lab 2, graded: a rank's shard as a parameter (``sharded_parameter``) and its inverse
(``unshard``), on every group of a layout at once in a world of four.

What is swept (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws another permuted
layout): TP groups of 2, consecutive ([0, 1] [2, 3]), strided ([0, 2] [1, 3]) and permuted, and
the world (one group of 4); fused tensors of 1, 2 and 3 blocks split along either dimension;
fp32 and bf16 (a shard keeps its tensor's dtype).

The tensors are numbered: entry i along the split dimension holds i, so the right answer is a
list of entry numbers and a wrong one shows where its entries came from. The entries each rank
holds are read from lab 2's snapshot; unshard is given shards and marks made by this file, so
that it is graded on its own, before sharded_parameter.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close, assert_close_naming, attempt
from reference_impl.comm.device import current_device
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import group_layouts, group_of, label

pytestmark = pytest.mark.lab2

WORLD = 4
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# (entries along dim, dim, blocks, dtype); every count divides by blocks * tp for tp 2 and 4
SIZES = [(12, 0, 3, "fp32"), (8, 1, 1, "bf16"), (16, 0, 2, "fp32"), (24, 1, 3, "bf16")]
MOVED = 1000.0  # added to the full tensor after sharding: a view of it would move too

WORLD_RANK = ("the piece was chosen by the rank in the world, not in the group: a rank's piece is "
              "its position in its group, which differs from its world rank outside [0, tp) and "
              "in every non-consecutive layout (dist.get_rank(group))")
WORLD_MODULO = ("the piece was chosen by the world rank modulo tp: that is a rank's position in its "
                "group only when groups are consecutive ranks; in a strided or permuted layout it "
                "is not (the position in the group comes from the group)")
WORLD_SIZE = ("the shard has fewer entries than tp gives: tp was taken as the world's size, not "
              "the group's")
NO_BLOCKS = ("the blocks were not passed on: the fused tensor was cut into tp contiguous pieces, "
             "not each of its blocks on its own")
A_VIEW = ("the parameter shares memory with the full tensor (it moved when the full tensor was "
          "changed): a shard is a tensor of its own")
RANK_MAJOR = ("the gathered parts were joined rank by rank: each rank's part holds its piece of "
              "every block, so the blocks were not put back in order (block by block, each block "
              "every rank's piece)")
OVER_THE_WORLD = ("the parts were gathered over the world, not over the group it was given")
REPLICATED_GATHERED = ("a parameter without tp_dim was gathered: it is whole on every rank "
                       "already and must come back as it is")


def cases(tp: int, seed: int, sizes=SIZES) -> list[dict]:
    """Every layout of groups of ``tp`` on WORLD ranks, with every size."""
    return [{"tp": tp, "layout": name, "entries": count, "dim": dim, "blocks": blocks,
             "dtype": dtype}
            for name in group_layouts(WORLD, tp, seed) for count, dim, blocks, dtype in sizes]


def numbered(count, dim, dtype="fp32"):
    """Entry i along ``dim`` holds i (5 entries across)."""
    full = torch.arange(count, dtype=DTYPES[dtype]).repeat(5, 1)  # (5, count)
    return full if dim == 1 else full.T.contiguous()


def rows_of(position, count, blocks, tp):
    """The entries the rank at ``position`` of its group of ``tp`` holds (lab 2's snapshot)."""
    return snapshot("lab2", "positions")[f"{count}/{blocks}/{tp}"][position]


def rows(full, dim, numbers):
    return full.index_select(dim, torch.tensor(numbers, device=full.device))



def described(parameter, full):
    full.add_(MOVED)
    return {"value": parameter.detach().cpu().clone(), "parameter": isinstance(parameter, nn.Parameter),
            "leaf": parameter.is_leaf, "tp_dim": getattr(parameter, "tp_dim", None),
            "tp_blocks": getattr(parameter, "tp_blocks", None)}


def shards_and_full_tensors(impl, tp, seed, sizes=SIZES):
    """{case label: {"unshard": full or error, "sharded_parameter": description or error}},
    and {"replicated": unshard of a parameter without marks}."""
    rank, device = dist.get_rank(), current_device()
    layers = impl.module("tp_layers")
    found, mine = {}, {}
    for name, groups in group_layouts(WORLD, tp, seed).items():  # every rank, the same order
        handles = [dist.new_group(ranks) for ranks in groups]
        mine[name] = (handles[groups.index(group_of(rank, groups))], group_of(rank, groups))
    for config in cases(tp, seed, sizes):
        group, ranks = mine[config["layout"]]
        count, dim, blocks = config["entries"], config["dim"], config["blocks"]
        full = numbered(count, dim, config["dtype"]).to(device)
        local = nn.Parameter(rows(full, dim, rows_of(ranks.index(rank), count, blocks, tp)))
        local.tp_dim, local.tp_blocks = dim, blocks
        found[label(config, seed)] = {
            "unshard": attempt(lambda: layers.unshard(local.detach(), local, group).cpu()),
            "sharded_parameter": attempt(lambda: described(
                layers.sharded_parameter(full, dim, group, blocks), full))}
    replicated = nn.Parameter(torch.arange(5.0, device=device))
    group = next(iter(mine.values()))[0]
    found["replicated"] = attempt(lambda: layers.unshard(replicated.detach(), replicated,
                                                         group).cpu())
    return found


def check_sharded_parameter(results, tp, seed, sizes=SIZES):
    for config in cases(tp, seed, sizes):
        groups = group_layouts(WORLD, tp, seed)[config["layout"]]
        count, dim, blocks = config["entries"], config["dim"], config["blocks"]
        what = f"sharded_parameter(dim={dim}, blocks={blocks}) over {groups} [{label(config, seed)}]"
        full = numbered(count, dim, config["dtype"])
        position = [group_of(r, groups).index(r) for r in range(WORLD)]
        expected = [rows(full, dim, rows_of(position[r], count, blocks, tp)) for r in range(WORLD)]
        made = [found[label(config, seed)]["sharded_parameter"] for found in results]
        wrong = [r for r in range(WORLD) if isinstance(made[r], str)
                 or not torch.equal(made[r]["value"], expected[r])]
        moved_off = [r for r in range(WORLD) if position[r] != r]
        if wrong and wrong == moved_off:
            shown = made[wrong[0]] if isinstance(made[wrong[0]], str) else "other entries"
            raise AssertionError(f"{what}: exactly the ranks whose position in their group is not "
                                 f"their world rank are wrong ({wrong}; rank {wrong[0]}: {shown}). "
                                 f"Likely cause: {WORLD_RANK}")
        for rank in range(WORLD):
            if isinstance(made[rank], str):
                raise AssertionError(f"{what} raised on rank {rank}: {made[rank]}")
            value = made[rank]["value"]
            fewer = value.dim() == 2 and value.shape[dim] < expected[rank].shape[dim]
            assert value.dtype == expected[rank].dtype, (
                f"{what} on rank {rank}: the shard is {value.dtype}, the full tensor "
                f"{expected[rank].dtype}: a shard keeps its tensor's dtype")
            assert_close_naming(value, expected[rank], what, rank=rank, atol=0,
                                against="piece r of every block, r the position in the group",
                                mistakes={A_VIEW: expected[rank] + MOVED,
                                          WORLD_MODULO: rows(full, dim, rows_of(
                                              rank % tp, count, blocks, tp)),
                                          **({NO_BLOCKS: rows(full, dim, rows_of(
                                              position[rank], count, 1, tp))} if blocks > 1
                                             else {})},
                                otherwise=WORLD_SIZE if fewer else
                                "rank r of the group keeps piece r of every block")
            marks = (made[rank]["parameter"], made[rank]["leaf"], made[rank]["tp_dim"],
                     made[rank]["tp_blocks"])
            assert marks == (True, True, dim, blocks), (
                f"{what} on rank {rank}: (an nn.Parameter, a leaf, tp_dim, tp_blocks) = {marks}, "
                f"expected (True, True, {dim}, {blocks}): a shard is a parameter trained on its "
                "own, marked with the dimension and the blocks that unshard reads")


def check_unshard(results, tp, seed, sizes=SIZES):
    for config in cases(tp, seed, sizes):
        groups = group_layouts(WORLD, tp, seed)[config["layout"]]
        count, dim, blocks = config["entries"], config["dim"], config["blocks"]
        what = f"unshard(dim={dim}, blocks={blocks}) over {groups} [{label(config, seed)}]"
        full = numbered(count, dim, config["dtype"])
        joined = torch.cat([rows(full, dim, rows_of(r, count, blocks, tp)) for r in range(tp)], dim)
        for rank, found in enumerate(results):
            value = found[label(config, seed)]["unshard"]
            if isinstance(value, str):
                raise AssertionError(f"{what} raised on rank {rank}: {value}")
            longer = value.dim() == 2 and value.shape[dim] > count
            assert_close_naming(value, full, what, rank=rank, atol=0, against="the full tensor",
                                mistakes={RANK_MAJOR: joined} if blocks > 1 else {},
                                otherwise=OVER_THE_WORLD if longer else
                                "the full tensor lists block by block, each block every rank's piece")
    for rank, found in enumerate(results):
        value = found["replicated"]
        if isinstance(value, str):
            raise AssertionError(f"unshard of a replicated parameter raised on rank {rank}: {value}")
        assert_close(value, torch.arange(5.0), "unshard of a replicated parameter (no tp_dim)",
                     rank=rank, atol=0, against="the parameter as it is",
                     likely_cause=REPLICATED_GATHERED if value.numel() > 5 else "")


def check_on_every_layout(impl, run_on_ranks, tp, seed, sizes=SIZES):
    results = run_on_ranks(shards_and_full_tensors, WORLD, impl, tp, seed, sizes)
    check_unshard(results, tp, seed, sizes)
    check_sharded_parameter(results, tp, seed, sizes)


@pytest.mark.parametrize("tp", [2, 4], ids=["tp2-layouts", "tp4-world"])
def test_sharded_parameter_and_unshard_on_every_layout(impl, run_on_ranks, sweep_seed, tp):
    check_on_every_layout(impl, run_on_ranks, tp, sweep_seed)
