"""Lab 1, graded: the rank layout (SageMaker's 8-GPU table, the group properties over every small
layout, the figure) and real process groups that contain exactly the intended ranks.

The student's code runs in a helper process or on the ranks; every layout it returns comes back
as data (groups as lists, coordinates as tuples) and is checked here, against the table of
SageMaker's documentation and against the groups computed in this file from their definition
(``expected_layout``)."""
import contextlib
import io
import itertools

import pytest
import torch
import torch.distributed as dist

from reference_impl.figures.rank_groups import plot_rank_groups
from reference_impl.comm.device import current_device

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

# The three axes of a rank's coordinates; an order lists them fastest-varying first.
AXES = ("tp", "pp", "rdp")
ORDERS = {"sagemaker": ("pp", "tp", "rdp"), "megatron": ("tp", "rdp", "pp")}
ALL_ORDERS = list(ORDERS) + ["-".join(p) for p in itertools.permutations(AXES)]
# The axes along which the members of each kind of group differ (SageMaker's definitions).
VARYING = {"TP": ("tp",), "PP": ("pp",), "DP": ("tp", "rdp"), "RDP": ("rdp",),
           "MP": ("tp", "pp"), "WORLD": AXES}
COORDINATE_OF = {"TP": "tp_rank", "PP": "pp_rank", "DP": "dp_rank", "RDP": "rdp_rank",
                 "MP": "mp_rank"}


def expected_layout(world_size, tp, pp, order, first_axis_fastest=True):
    """{kind: sorted groups}, from the definition: rank r's position along each axis is its
    mixed-radix digit (the order's first axis varying fastest); a group holds the ranks that
    agree on every axis its kind does not vary. ``first_axis_fastest=False``: the mistake of
    numbering the other way round."""
    axes = ORDERS.get(order, tuple(order.split("-")))
    if not first_axis_fastest:
        axes = axes[::-1]
    sizes = {"tp": tp, "pp": pp, "rdp": world_size // (tp * pp)}
    position = []
    for rank in range(world_size):
        digits, rest = {}, rank
        for axis in axes:
            digits[axis] = rest % sizes[axis]
            rest //= sizes[axis]
        position.append(digits)
    groups = {}
    for kind, varying in VARYING.items():
        fixed = [axis for axis in AXES if axis not in varying]
        keys = {}
        for rank in range(world_size):
            keys.setdefault(tuple(position[rank][axis] for axis in fixed), []).append(rank)
        groups[kind] = sorted(keys.values())
    return groups


def group_of(groups, kind, rank):
    return next(group for group in groups[kind] if rank in group)


def layout_as_data(layout):
    """A RankLayout as plain data: its groups and each rank's coordinates."""
    return {"groups": {kind: [list(group) for group in groups]
                       for kind, groups in layout.groups.items()},
            "ranks": [{name: getattr(c, name) for name in COORDINATE_OF.values()}
                      for c in layout.ranks]}


def cli_output(impl, argv):
    """What ``groups.main(argv)`` prints."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        impl.module("groups").main(argv)
    return printed.getvalue()



def all_small_layouts(max_world_size=16):
    for world_size in range(1, max_world_size + 1):
        for tp, pp in itertools.product(range(1, world_size + 1), repeat=2):
            if world_size % (tp * pp) == 0:
                yield world_size, tp, pp


def test_cli_reproduces_the_sagemaker_8_gpu_table(impl, run_alone):
    lines = run_alone(cli_output, impl, ["--world-size", "8", "--tp", "2", "--pp", "2", "--order",
                                         "sagemaker"]).splitlines()
    assert lines[:8] == SAGEMAKER_8_GPU_TABLE


def test_cli_prints_the_groups_after_the_table(impl, run_alone):
    groups = run_alone(cli_output, impl, ["--world-size", "8", "--tp", "2", "--pp", "2"]
                       ).splitlines()[9:]
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


def test_megatron_order_puts_tp_peers_on_neighbouring_ranks(impl, run_alone):
    lines = run_alone(cli_output, impl, ["--world-size", "8", "--tp", "2", "--pp", "2", "--order",
                                         "megatron"]).splitlines()
    assert lines[1] == "GPU1: pp_rank 0, tp_rank 1, rdp_rank 0, dp_rank 1, mp_rank 1"
    assert lines[9] == "TP_GROUP:  [0, 1] [2, 3] [4, 5] [6, 7]"
    assert lines[11] == "DP_GROUP:  [0, 1, 2, 3] [4, 5, 6, 7]"
    # Megatron's data-parallel group is SageMaker's RDP_GROUP.
    assert lines[12] == "RDP_GROUP: [0, 2] [1, 3] [4, 6] [5, 7]"


def saved_figure(impl, target):
    cli_output(impl, ["--world-size", "8", "--tp", "2", "--pp", "2", "--plot", target])
    with open(target, "rb") as handle:
        return handle.read(8)


def test_cli_saves_a_figure(impl, run_alone, tmp_path):
    assert run_alone(saved_figure, impl, str(tmp_path / "groups.png")) == b"\x89PNG\r\n\x1a\n"


def figure_panels(impl):
    """The figure of the 8-GPU layout, as data: each panel's title and number of labels."""
    figure = plot_rank_groups(impl.module("groups").build_rank_layout(8, tp=2, pp=2))
    return [(axes.get_title(), len(axes.texts)) for axes in figure.axes]


def test_figure_has_a_panel_per_group_kind(impl, run_alone):
    panels = run_alone(figure_panels, impl)
    titles = [title for title, _ in panels]
    assert [title.split(":")[0].split("\n")[0] for title in titles] == [
        "TP_GROUP", "PP_GROUP", "DP_GROUP", "RDP_GROUP", "MP_GROUP", "WORLD"]
    assert "4 group(s) of 2" in titles[0]
    assert all(labels == 8 for _, labels in panels)  # one label per GPU


def small_layouts(impl, order):
    build = impl.module("groups").build_rank_layout
    return [layout_as_data(build(world_size, tp, pp, order))
            for world_size, tp, pp in all_small_layouts()]


@pytest.mark.parametrize("order", ALL_ORDERS)
def test_group_properties_hold_for_every_small_layout(impl, run_alone, order):
    for (world_size, tp, pp), layout in zip(all_small_layouts(), run_alone(small_layouts, impl,
                                                                            order)):
        where = f"world {world_size}, tp {tp}, pp {pp}, order {order}"
        expected = expected_layout(world_size, tp, pp, order)
        reversed_order = expected_layout(world_size, tp, pp, order, first_axis_fastest=False)
        for kind, groups in expected.items():
            got = sorted(layout["groups"].get(kind, []))
            cause = ("the order's first axis must vary fastest (stride 1); here it varies "
                     "slowest" if got == reversed_order[kind] else
                     "a group holds the ranks that differ only along "
                     f"{' and '.join(VARYING[kind])}")
            assert got == groups, f"{kind}_GROUP ({where}): got {got}, expected {groups}: {cause}"
        for rank, coordinates in enumerate(layout["ranks"]):
            for kind, name in COORDINATE_OF.items():
                group = group_of(expected, kind, rank)
                assert coordinates[name] == group.index(rank), (
                    f"rank {rank}'s {name} is {coordinates[name]} ({where}); it is the rank's "
                    f"index in its {kind}_GROUP {group}, i.e. {group.index(rank)}")


@pytest.mark.parametrize("order, contiguous_kind", [("sagemaker", "PP"), ("megatron", "TP")])
def test_fastest_axis_groups_are_neighbouring_ranks(impl, run_alone, order, contiguous_kind):
    layout = next(layout for (world_size, tp, pp), layout in
                  zip(all_small_layouts(), run_alone(small_layouts, impl, order))
                  if (world_size, tp, pp) == (16, 2, 4))
    for group in layout["groups"][contiguous_kind]:
        assert list(group) == list(range(group[0], group[0] + len(group)))


# ------------------------------------------------------------ real groups, 8 ranks

def sums_over_every_group(impl, tp, pp, order):
    """Each rank contributes 2**rank; a sum over a group says exactly who was in it."""
    layout = impl.module("groups").build_rank_layout(dist.get_world_size(), tp, pp, order)
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
    expected = expected_layout(8, tp, pp, order)
    for rank, seen in enumerate(run_on_ranks(sums_over_every_group, 8, impl, tp, pp, order)):
        assert sorted(seen) == sorted(expected), f"rank {rank}: groups of kinds {sorted(seen)}"
        for kind, (members, group_rank) in seen.items():
            group = group_of(expected, kind, rank)
            stranger = ("; this rank is not a member of the group it kept (its rank there is "
                        "-1): each rank keeps the group of each kind that it belongs to"
                        if group_rank < 0 else "")
            assert members == group, (f"rank {rank}: an all-reduce over its {kind}_GROUP summed "
                                      f"ranks {members}, expected {group}{stranger}")
            assert group_rank == group.index(rank), f"rank {rank}, {kind}_GROUP rank"
