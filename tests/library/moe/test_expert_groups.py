"""The expert-parallel rank layout (pure: no process group) and the constraints it enforces,
naming the numbers: E divisible by ep, dp divisible by ep."""
import pytest

from reference_impl.comm.expert_groups import ExpertGroups, expert_parallel_groups, experts_of_rank
from reference_impl.moe.expert_parallel import ExpertParallelMoE
from reference_impl.moe.moe_layer import MoELayer


def test_ep_groups_are_consecutive_and_edp_groups_strided():
    groups = expert_parallel_groups([range(8)], ep=4)
    assert groups == {"DP": ((0, 1, 2, 3, 4, 5, 6, 7),),
                      "EP": ((0, 1, 2, 3), (4, 5, 6, 7)),
                      "EDP": ((0, 4), (1, 5), (2, 6), (3, 7))}


def test_several_data_parallel_groups_each_get_their_own():
    # e.g. two pipeline stages of 4 data-parallel ranks each, numbered in any order
    groups = expert_parallel_groups([(1, 3, 5, 7), (6, 4, 2, 0)], ep=2)
    assert groups["DP"] == ((1, 3, 5, 7), (0, 2, 4, 6))
    assert groups["EP"] == ((1, 3), (5, 7), (0, 2), (4, 6))
    assert groups["EDP"] == ((1, 5), (3, 7), (0, 4), (2, 6))


@pytest.mark.parametrize("ep", [1, 8])
def test_the_extremes(ep):
    groups = expert_parallel_groups([range(8)], ep=ep)
    assert len(groups["EP"]) == 8 // ep and all(len(g) == ep for g in groups["EP"])
    assert len(groups["EDP"]) == ep and all(len(g) == 8 // ep for g in groups["EDP"])


def test_experts_of_each_rank():
    assert [list(experts_of_rank(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert list(experts_of_rank(4, 1, 0)) == [0, 1, 2, 3]


def test_experts_not_divisible_by_ep():
    with pytest.raises(ValueError, match="8 experts are not divisible by ep = 3"):
        experts_of_rank(8, 3, 0)
    groups = ExpertGroups(dp=None, ep=None, edp=None, dp_size=4, ep_size=4, ep_rank=0)
    with pytest.raises(ValueError, match="6 experts are not divisible by ep = 4"):
        ExpertParallelMoE(MoELayer(8, 16, num_experts=6), groups)


def test_dp_not_divisible_by_ep():
    with pytest.raises(ValueError, match="data-parallel size dp = 6 is not divisible by ep = 4"):
        expert_parallel_groups([range(6)], ep=4)
