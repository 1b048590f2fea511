"""Rank layouts and process groups, reference only: clear errors for bad input, and the
DeviceMesh built from a layout has the same groups."""
import pytest
import torch.distributed as dist

from reference_impl.comm.groups import build_rank_layout, main, parse_order
from reference_impl.comm.device import current_device
from reference_impl.comm.process_groups import device_mesh, mesh_dim_names


@pytest.mark.parametrize("call, message", [
    (lambda: build_rank_layout(6, tp=2, pp=2), r"world size 6 is not divisible by tp\*pp = 4"),
    (lambda: build_rank_layout(8, tp=0), "tp must be an integer >= 1, got 0"),
    (lambda: build_rank_layout(8, pp=-1), "pp must be an integer >= 1, got -1"),
    (lambda: build_rank_layout(0), "world size must be an integer >= 1, got 0"),
    (lambda: build_rank_layout(8, tp=2, order="deepspeed"), "unknown order 'deepspeed'"),
    (lambda: parse_order("tp-pp"), "unknown order 'tp-pp'"),
    (lambda: build_rank_layout(8).coordinates(8), r"rank 8 is out of range for world size 8"),
    (lambda: build_rank_layout(8).group_of("TP", -1), "rank -1 is out of range"),
    (lambda: build_rank_layout(8).group_of("EP", 0), "unknown group kind 'EP'"),
])
def test_bad_input_is_refused_naming_the_numbers(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_cli_reports_bad_input_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["--world-size", "6", "--tp", "2", "--pp", "2"])
    assert caught.value.code == 2
    assert "world size 6 is not divisible by tp*pp = 4" in capsys.readouterr().err


def mesh_groups(tp, pp, order):
    layout = build_rank_layout(dist.get_world_size(), tp, pp, order)
    mesh = device_mesh(layout, current_device().type)
    found = {}
    for kind in ("TP", "PP", "RDP"):
        found[kind] = dist.get_process_group_ranks(mesh.get_group(kind.lower()))
    for kind in ("DP", "MP", "WORLD"):
        found[kind] = mesh[mesh_dim_names(layout, kind)].mesh.flatten().tolist()
    return found


@pytest.mark.parametrize("order", ["sagemaker", "megatron"])
def test_device_mesh_has_the_same_groups(run_on_ranks, order):
    layout = build_rank_layout(8, 2, 2, order)
    for rank, found in enumerate(run_on_ranks(mesh_groups, 8, 2, 2, order)):
        for kind, members in found.items():
            assert sorted(members) == list(layout.group_of(kind, rank)), f"rank {rank}, {kind}"
