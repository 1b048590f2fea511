"""The context-parallel axis of the rank layout (``groups.build_rank_layout(..., cp=)``): the
groups of a few layouts written out by hand, in Megatron-core's order (tp fastest, then cp, then
the replicas, then the stages) and in SageMaker's, the coordinates, the refusals, and the real
process groups and device mesh on 4 ranks."""
import pytest
import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device
from reference_impl.comm.groups import build_rank_layout, main
from reference_impl.comm.process_groups import create_process_groups, device_mesh, mesh_dim_names

# (world, tp, pp, cp, order) -> every group of every kind, by hand from the definitions:
# CP varies cp, RDP the replicas, RDP_CP both, DP tp x cp x rdp (one stage), MP tp x pp.
HAND_WRITTEN = {
    # megatron tp-cp-dp-pp, 8 = tp2 x cp2 x dp2: Megatron-core's groups for the same sizes
    (8, 2, 1, 2, "megatron"): {
        "TP": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "PP": [[0], [1], [2], [3], [4], [5], [6], [7]],
        "DP": [[0, 1, 2, 3, 4, 5, 6, 7]],
        "RDP": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "MP": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "CP": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "RDP_CP": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "WORLD": [[0, 1, 2, 3, 4, 5, 6, 7]],
    },
    # megatron, 8 = cp2 x dp2 x pp2: stride 1 cp, 2 dp, 4 pp
    (8, 1, 2, 2, "megatron"): {
        "TP": [[0], [1], [2], [3], [4], [5], [6], [7]],
        "PP": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "DP": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "RDP": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "MP": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "CP": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "RDP_CP": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "WORLD": [[0, 1, 2, 3, 4, 5, 6, 7]],
    },
    # sagemaker pp-tp-cp-rdp, 8 = pp2 x tp2 x cp2, one replica: stride 1 pp, 2 tp, 4 cp
    (8, 2, 2, 2, "sagemaker"): {
        "TP": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "PP": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "DP": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "RDP": [[0], [1], [2], [3], [4], [5], [6], [7]],
        "MP": [[0, 1, 2, 3], [4, 5, 6, 7]],
        "CP": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "RDP_CP": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "WORLD": [[0, 1, 2, 3, 4, 5, 6, 7]],
    },
    # megatron, 12 = tp2 x cp3 x dp2: cp of 3 (strides 1 tp, 2 cp, 6 dp)
    (12, 2, 1, 3, "megatron"): {
        "TP": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]],
        "PP": [[rank] for rank in range(12)],
        "DP": [list(range(12))],
        "RDP": [[0, 6], [1, 7], [2, 8], [3, 9], [4, 10], [5, 11]],
        "MP": [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]],
        "CP": [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]],
        "RDP_CP": [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]],
        "WORLD": [list(range(12))],
    },
}


@pytest.mark.parametrize("key", HAND_WRITTEN, ids=lambda key: "w{}-tp{}-pp{}-cp{}-{}".format(*key))
def test_groups_are_the_hand_written_ones(key):
    world, tp, pp, cp, order = key
    layout = build_rank_layout(world, tp, pp, order, cp=cp)
    assert list(layout.groups) == list(HAND_WRITTEN[key])  # the kinds, in describe's order
    for kind, groups in HAND_WRITTEN[key].items():
        assert [list(group) for group in layout.groups[kind]] == groups, kind
        for rank in range(world):  # each coordinate is the rank's index in that group
            group = layout.group_of(kind, rank)
            name = {"CP": "cp_rank", "RDP": "rdp_rank", "TP": "tp_rank", "PP": "pp_rank",
                    "DP": "dp_rank", "MP": "mp_rank"}.get(kind)
            if name:
                assert getattr(layout.coordinates(rank), name) == group.index(rank), (kind, rank)
    assert (layout.cp, layout.rdp) == (cp, world // (tp * pp * cp))


def test_megatron_order_is_tp_cp_dp_pp():
    layout = build_rank_layout(16, tp=2, pp=2, order="megatron", cp=2)
    assert layout.axes == ("tp", "cp", "rdp", "pp")
    # rank = tp + 2 cp + 4 rdp + 8 pp
    assert layout.coordinates(13) == layout.coordinates(13).__class__(
        rank=13, tp_rank=1, pp_rank=1, rdp_rank=1, dp_rank=5, mp_rank=3, cp_rank=0)
    assert layout.group_of("CP", 13) == (13, 15)
    assert layout.group_of("RDP", 13) == (9, 13)
    assert layout.group_of("RDP_CP", 13) == (9, 11, 13, 15)


def test_cp_1_is_the_layout_without_it():
    with_default = build_rank_layout(8, tp=2, pp=2, order="megatron")
    explicit = build_rank_layout(8, tp=2, pp=2, order="megatron", cp=1)
    assert with_default == explicit
    assert list(explicit.groups) == ["TP", "PP", "DP", "RDP", "MP", "WORLD"]
    assert all(coords.cp_rank == 0 for coords in explicit.ranks)


@pytest.mark.parametrize("call, message", [
    (lambda: build_rank_layout(12, tp=2, pp=2, cp=2),
     r"world size 12 is not divisible by tp\*cp\*pp = 8 \(tp=2, cp=2, pp=2\)"),
    (lambda: build_rank_layout(8, cp=3), r"world size 8 is not divisible by tp\*cp\*pp = 3"),
    (lambda: build_rank_layout(8, cp=0), "cp must be an integer >= 1, got 0"),
])
def test_bad_cp_is_refused_naming_the_numbers(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_cli_prints_the_cp_groups(capsys):
    main(["--world-size", "8", "--tp", "2", "--cp", "2", "--order", "megatron"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "GPU2: pp_rank 0, tp_rank 0, rdp_rank 0, dp_rank 2, mp_rank 0, cp_rank 1"
    assert "CP_GROUP:     [0, 2] [1, 3] [4, 6] [5, 7]" in lines
    assert "RDP_CP_GROUP: [0, 2, 4, 6] [1, 3, 5, 7]" in lines


def reductions_and_mesh(cp, order):
    """Each rank adds 2**rank over its CP, RDP and RDP_CP groups (the sum names the members);
    the device mesh's groups of the same kinds."""
    layout = build_rank_layout(dist.get_world_size(), 1, 1, order, cp=cp)
    groups = create_process_groups(layout)
    mesh = device_mesh(layout, current_device().type)
    seen = {}
    for kind in ("CP", "RDP", "RDP_CP"):
        value = torch.tensor([2 ** dist.get_rank()], dtype=torch.int64, device=current_device())
        dist.all_reduce(value, group=groups.of_kind(kind))
        summed = [rank for rank in range(dist.get_world_size()) if int(value.item()) >> rank & 1]
        seen[kind] = (summed, mesh[mesh_dim_names(layout, kind)].mesh.flatten().tolist())
    seen["gradient group"] = dist.get_process_group_ranks(groups.rdp_cp_or_rdp)
    return seen


def test_real_cp_groups_on_4_ranks(run_on_ranks):
    layout = build_rank_layout(4, 1, 1, "megatron", cp=2)  # cp [0,1] [2,3], rdp [0,2] [1,3]
    for rank, seen in enumerate(run_on_ranks(reductions_and_mesh, 4, 2, "megatron")):
        for kind in ("CP", "RDP", "RDP_CP"):
            summed, meshed = seen[kind]
            assert summed == list(layout.group_of(kind, rank)), (rank, kind, summed)
            assert sorted(meshed) == summed, (rank, kind, meshed)
        assert seen["gradient group"] == [0, 1, 2, 3]
