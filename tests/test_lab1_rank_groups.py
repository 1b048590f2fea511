"""Lab 1, graded: the rank layout (SageMaker's 8-GPU table, the group properties over every small
layout, the figure) and real process groups that contain exactly the intended ranks.

The process-group tests build their layout with the reference, so they grade
``create_process_groups`` on its own."""
import itertools

import pytest
import torch
import torch.distributed as dist

from reference_impl.comm.groups import AXES, ORDERS, build_rank_layout
from reference_impl.comm.groups_figure import plot_rank_groups
from reference_impl.comm.launcher import current_device

pytestmark = pytest.mark.lab1

# The SageMaker model parallelism library documentation, "Ranking Mechanism when Using a
# Combination of Pipeline Parallelism and Tensor Parallelism": 8 GPUs, tensor parallel degree 2,
# pipeline parallel degree 2, data parallel degree 4.
SAGEMAKER_8_GPU_TABLE = """\
GPU0: pp_rank 0, tp_rank 0, rdp_rank 0, dp_rank 0, mp_rank 0
GPU1: pp_rank 1, tp_rank 0, rdp_rank 0, dp_rank 0, mp_rank 1
GPU2: pp_rank 0, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 2
GPU3: pp_rank 1, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 3
GPU4: pp_rank 0, tp_rank 0, rdp_rank 1, dp_rank 2, mp_rank 0
GPU5: pp_rank 1, tp_rank 0, rdp_rank 1, dp_rank 2, mp_rank 1
GPU6: pp_rank 0, tp_rank 1, rdp_rank 1, dp_rank 3, mp_rank 2
GPU7: pp_rank 1, tp_rank 1, rdp_rank 1, dp_rank 3, mp_rank 3""".splitlines()

ALL_ORDERS = list(ORDERS) + ["-".join(p) for p in itertools.permutations(AXES)]


def all_small_layouts(max_world_size=16):
    for world_size in range(1, max_world_size + 1):
        for tp, pp in itertools.product(range(1, world_size + 1), repeat=2):
            if world_size % (tp * pp) == 0:
                yield world_size, tp, pp


def test_cli_reproduces_the_sagemaker_8_gpu_table(impl, capsys):
    impl.module("groups").main(["--world-size", "8", "--tp", "2", "--pp", "2", "--order", "sagemaker"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:8] == SAGEMAKER_8_GPU_TABLE


def test_cli_prints_the_groups_after_the_table(impl, capsys):
    impl.module("groups").main(["--world-size", "8", "--tp", "2", "--pp", "2"])
    groups = capsys.readouterr().out.splitlines()[9:]
    # SageMaker's ranking page: pipelines (0,1) (2,3) (4,5) (6,7); data parallelism over 0,2,4,6 and
    # 1,3,5,7; tensor parallelism over (0,2) (1,3) (4,6) (5,7).
    assert groups == [
        "TP_GROUP:  [0, 2] [1, 3] [4, 6] [5, 7]",
        "PP_GROUP:  [0, 1] [2, 3] [4, 5] [6, 7]",
        "DP_GROUP:  [0, 2, 4, 6] [1, 3, 5, 7]",
        "RDP_GROUP: [0, 4] [1, 5] [2, 6] [3, 7]",
        "MP_GROUP:  [0, 1, 2, 3] [4, 5, 6, 7]",
        "WORLD:     [0, 1, 2, 3, 4, 5, 6, 7]",
    ]


def test_megatron_order_puts_tp_peers_on_neighbouring_ranks(impl, capsys):
    impl.module("groups").main(["--world-size", "8", "--tp", "2", "--pp", "2", "--order", "megatron"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "GPU1: pp_rank 0, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 1"
    assert lines[9] == "TP_GROUP:  [0, 1] [2, 3] [4, 5] [6, 7]"
    assert lines[11] == "DP_GROUP:  [0, 1, 2, 3] [4, 5, 6, 7]"
    # Megatron's data-parallel group is SageMaker's RDP_GROUP.
    assert lines[12] == "RDP_GROUP: [0, 2] [1, 3] [4, 6] [5, 7]"


def test_cli_saves_a_figure(impl, tmp_path, capsys):
    target = tmp_path / "groups.png"
    impl.module("groups").main(["--world-size", "8", "--tp", "2", "--pp", "2", "--plot", str(target)])
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figure_has_a_panel_per_group_kind(impl):
    figure = plot_rank_groups(impl.module("groups").build_rank_layout(8, tp=2, pp=2))
    titles = [axes.get_title() for axes in figure.axes]
    assert [title.split(":")[0].split("\n")[0] for title in titles] == [
        "TP_GROUP", "PP_GROUP", "DP_GROUP", "RDP_GROUP", "MP_GROUP", "WORLD"]
    assert "4 group(s) of 2" in titles[0]
    assert all(len(axes.texts) == 8 for axes in figure.axes)  # one label per GPU


@pytest.mark.parametrize("order", ALL_ORDERS)
def test_group_properties_hold_for_every_small_layout(impl, order):
    build = impl.module("groups").build_rank_layout
    for world_size, tp, pp in all_small_layouts():
        layout = build(world_size, tp, pp, order)
        where = f"world {world_size}, tp {tp}, pp {pp}, order {order}"
        sizes = {"TP": tp, "PP": pp, "DP": world_size // pp, "RDP": world_size // (tp * pp),
                 "MP": tp * pp, "WORLD": world_size}
        for kind, groups in layout.groups.items():
            members = sorted(rank for group in groups for rank in group)
            assert members == list(range(world_size)), f"{kind} is not a partition ({where})"
            assert {len(group) for group in groups} == {sizes[kind]}, f"{kind} size ({where})"
        # Each rank has a unique (tp, pp, rdp) coordinate.
        coords = {(c.tp_rank, c.pp_rank, c.rdp_rank) for c in layout.ranks}
        assert len(coords) == world_size, where
        for rank, c in enumerate(layout.ranks):
            group = {kind: set(layout.group_of(kind, rank)) for kind in layout.groups}
            assert group["TP"] <= group["DP"] and group["TP"] <= group["MP"], where
            union_of_pp = set().union(*(layout.group_of("PP", peer) for peer in group["TP"]))
            assert group["MP"] == union_of_pp, where
            same_tp = {r for r in range(world_size) if layout.ranks[r].tp_rank == c.tp_rank}
            assert group["RDP"] == group["DP"] & same_tp, where
            for kind, index in (("TP", c.tp_rank), ("PP", c.pp_rank), ("RDP", c.rdp_rank),
                                ("DP", c.dp_rank), ("MP", c.mp_rank)):
                assert layout.group_of(kind, rank)[index] == rank, f"{kind} index ({where})"


@pytest.mark.parametrize("order, contiguous_kind", [("sagemaker", "PP"), ("megatron", "TP")])
def test_fastest_axis_groups_are_neighbouring_ranks(impl, order, contiguous_kind):
    layout = impl.module("groups").build_rank_layout(16, tp=2, pp=4, order=order)
    for group in layout.groups[contiguous_kind]:
        assert list(group) == list(range(group[0], group[0] + len(group)))


# ------------------------------------------------------------ real groups, 8 ranks

def sums_over_every_group(impl, tp, pp, order):
    """Each rank contributes 2**rank; a sum over a group says exactly who was in it."""
    layout = build_rank_layout(dist.get_world_size(), tp, pp, order)
    groups = impl.module("process_groups").create_process_groups(layout)
    seen = {}
    for kind in layout.groups:
        value = torch.tensor([2 ** dist.get_rank()], dtype=torch.int64, device=current_device())
        dist.all_reduce(value, group=groups.of_kind(kind))
        members = [rank for rank in range(dist.get_world_size()) if int(value.item()) >> rank & 1]
        seen[kind] = (members, dist.get_rank(groups.of_kind(kind)))
    return seen


@pytest.mark.parametrize("tp, pp, order", [(2, 2, "sagemaker"), (2, 2, "megatron"),
                                           (4, 1, "sagemaker"), (2, 4, "rdp-pp-tp"),
                                           (1, 8, "megatron")])
def test_real_groups_reduce_over_exactly_their_members(impl, run_on_ranks, tp, pp, order):
    layout = build_rank_layout(8, tp, pp, order)
    for rank, seen in enumerate(run_on_ranks(sums_over_every_group, 8, impl, tp, pp, order)):
        coords = layout.coordinates(rank)
        ranks_in_group = {"TP": coords.tp_rank, "PP": coords.pp_rank, "DP": coords.dp_rank,
                          "RDP": coords.rdp_rank, "MP": coords.mp_rank, "WORLD": rank}
        for kind, (members, group_rank) in seen.items():
            assert members == list(layout.group_of(kind, rank)), f"rank {rank}, {kind}_GROUP"
            assert group_rank == ranks_in_group[kind], f"rank {rank}, {kind}_GROUP rank"
