"""The all-to-all bytes and load formulas on counts worked out by hand (the measured bytes are
compared with them in ``test_expert_parallel.py``)."""
import pytest

from reference_impl.moe.moe_costs import (all_to_all_bytes, load_imbalance, relative_load,
                                          tokens_to_ranks)


def test_tokens_to_ranks_sums_each_ranks_experts():
    assert tokens_to_ranks([3, 0, 2, 5, 1, 1], ep=3) == [3, 7, 2]
    with pytest.raises(ValueError, match="6 experts are not divisible by ep = 4"):
        tokens_to_ranks([1] * 6, ep=4)


def test_all_to_all_bytes_by_hand():
    # ep = 2, 4 experts (rank 0 holds 0, 1; rank 1 holds 2, 3); hidden 8, fp32: 32 bytes a row.
    counts = [[1, 2, 3, 4],    # rank 0 keeps 3 rows, sends 7 to rank 1
              [5, 0, 2, 2]]    # rank 1 sends 5 to rank 0, keeps 4
    rank0 = all_to_all_bytes(counts, rank=0, hidden=8, bytes_per_element=4)
    assert (rank0.dispatch_forward, rank0.combine_forward) == (7 * 32, 5 * 32)
    assert (rank0.dispatch_backward, rank0.combine_backward) == (5 * 32, 7 * 32)
    rank1 = all_to_all_bytes(counts, rank=1, hidden=8, bytes_per_element=2)
    assert (rank1.forward, rank1.backward) == ((5 + 7) * 16, (7 + 5) * 16)


def test_load_imbalance_is_max_over_mean():
    assert relative_load([2, 2, 2, 2]) == [1.0] * 4
    assert load_imbalance([2, 2, 2, 2]) == 1.0
    assert load_imbalance([6, 1, 1, 0]) == 3.0     # mean 2
    assert load_imbalance([8, 0, 0, 0]) == 4.0     # all on one expert: E
    with pytest.raises(ValueError, match="no tokens"):
        load_imbalance([0, 0])
