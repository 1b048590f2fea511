"""What a rank sends back as data is plain data within bounds of values, bytes and depth,
checked before anything formats it: shared references are counted where they appear without
being expanded, so a structure of a few hundred bytes that would format into billions of values
is refused at once, naming the rank; what graded checks return is accepted."""
import collections
import io

import pytest
import torch

from reference_impl.comm import data_budget
from reference_impl.comm.data_budget import OverBudget, check
from reference_impl.comm.launcher import launch
from reference_impl.comm.rank_failures import RankFailure
from reference_impl.comm.rank_payloads import load, on_cpu

GUARD = pytest.mark.timeout(60)  # expanding what is shared would not end: the run goes on


def doubled(levels: int) -> list:
    """Each level a pair of the same list: ``levels`` lists, 2**levels leaves once expanded."""
    shared: list = []
    for _ in range(levels):
        shared = [shared, shared]
    return shared


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@GUARD
def test_a_doubled_sharing_of_60_levels_is_refused_without_being_expanded():
    with pytest.raises(OverBudget, match=r"rank 1's result holds [\d,]+ values, counting a "
                                         r"shared one each time it appears; the limit is "
                                         r"4,000,000"):
        check(doubled(60), "rank 1's result")


def test_a_value_shared_a_few_times_is_counted_each_time_and_accepted():
    row = [1.0, 2.0, 3.0]
    assert check({"first": row, "again": row}) == (1 + 2 + 2 * 4, 10, 3)  # keys and 2 rows


def test_nesting_is_bounded_without_recursion():
    assert check(nested(data_budget.MAX_DEPTH))[2] == data_budget.MAX_DEPTH
    for levels in (data_budget.MAX_DEPTH + 1, 200_000):
        with pytest.raises(OverBudget, match="levels deep; the limit is 100"):
            check(nested(levels))


def test_a_cycle_is_refused():
    loop: list = [1]
    loop.append({"back": loop})
    with pytest.raises(OverBudget, match="contains itself"):
        check(loop)


def test_too_many_values_are_refused_with_the_numbers(monkeypatch):
    monkeypatch.setattr(data_budget, "MAX_VALUES", 1_000)
    assert check(list(range(999)))[0] == 1_000
    with pytest.raises(OverBudget, match="holds 1,001 values, counting a shared one each "
                                         "time it appears; the limit is 1,000"):
        check([list(range(500)), list(range(498))])
    with pytest.raises(OverBudget, match="more than 1,000 values"):
        check([None] * 5_000)


def test_bytes_are_bounded_as_a_tensor_s_shape_says():
    assert check(torch.zeros(4, dtype=torch.float64))[1] == 32
    for huge in (torch.zeros(1).expand(1 << 40), ["x" * (data_budget.MAX_BYTES // 2)] * 3):
        with pytest.raises(OverBudget, match=r"bytes, counting a shared value each time it "
                                             r"appears; the limit is 268,435,456"):
            check(huge)


@pytest.mark.parametrize("thing", [slice(1, 2), torch.UntypedStorage(8), object(), print])
def test_what_is_not_plain_data_is_refused_by_its_type(thing):
    with pytest.raises(OverBudget, match="not plain data"):
        check({"fine": [1, 2], "odd": thing})


def test_every_kind_of_plain_data_torch_load_rebuilds_is_accepted():
    tagged = torch.ones(2)
    tagged.note = "kept by torch.save"
    value = ("ok", {"tensor": tagged, "shape": torch.Size([2, 3]), "dtype": torch.bfloat16,
                    "device": torch.device("cpu"), "ordered": collections.OrderedDict(a=1),
                    "counted": collections.Counter("aab"), "set": {1, 2}, "bytes": b"\x00",
                    "complex": 1j, "none": None, "flag": True, "big": 10 ** 40,
                    (1, "key"): [1.5, "text", bytearray(b"ab")]})
    buffer = io.BytesIO()
    torch.save(value, buffer)
    message = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    values, size, depth = check(message)
    assert values > 20 and size > 8 and depth == 4


def test_a_result_over_budget_is_this_rank_s_failure_when_loaded():
    buffer = io.BytesIO()
    torch.save(("ok", doubled(60)), buffer, pickle_protocol=2)
    assert len(buffer.getvalue()) < 4_000
    kind, text = load(buffer.getvalue(), "data")[1:3]
    assert kind == "ResultOverBudget" and "the rank's result holds" in text, text


@GUARD
def test_a_rank_s_result_on_the_cpu_keeps_what_it_shares():
    copy = on_cpu(doubled(60))
    assert copy[0] is copy[1]


def rank_one_returns_a_sharing_bomb():
    import torch.distributed as dist
    return doubled(60) if dist.get_rank() == 1 else [1, 2, 3]


def rank_one_returns_a_large_tensor():
    import torch.distributed as dist
    return torch.ones(1 << 19) if dist.get_rank() == 1 else torch.ones(2)


@GUARD
def test_a_rank_that_returns_a_sharing_bomb_fails_at_once_naming_the_rank():
    with pytest.raises(RankFailure, match=r"rank 1 failed: ResultOverBudget: the rank's "
                                          r"result holds [\d,]+ values") as failure:
        launch(rank_one_returns_a_sharing_bomb, 2, results="data")
    assert failure.value.rank == 1


def test_a_message_over_the_bytes_a_rank_may_send_is_left_unread(monkeypatch):
    monkeypatch.setattr(data_budget, "MAX_MESSAGE_BYTES", 1 << 20)  # rank 1 sends 2 MiB
    with pytest.raises(RankFailure, match=r"rank 1 failed: ResultOverBudget: the rank's "
                                          r"result is over 1,048,576 bytes") as failure:
        launch(rank_one_returns_a_large_tensor, 2, results="data")
    assert failure.value.rank == 1
