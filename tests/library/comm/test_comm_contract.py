"""The communication contract (``comm/comm_contract.py``) and what ``CommTracer`` records for
it: each call's group as global ranks and a send's or receive's peer, on real ranks; extra,
missing, mis-grouped and mis-sized operations each named."""
import pytest
import torch
import torch.distributed as dist

from reference_impl.comm.comm_contract import check_contract, contract_violations, expected
from reference_impl.comm.comm_trace import CommTracer


def traced_calls():
    """On 4 ranks: an all-reduce over the strided group holding this rank, and a send to the
    next rank of it or a receive from it."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[rank % 2]
    x = torch.ones(8)
    with CommTracer() as trace:
        dist.all_reduce(x, group=group)
        if rank < 2:
            dist.send(x, rank + 2)
        else:
            dist.recv(x, src=rank - 2)
    return [call.as_data() for call in trace.calls]


def test_the_tracer_records_groups_as_global_ranks_and_peers(run_on_ranks):
    for rank, calls in enumerate(run_on_ranks(traced_calls, 4)):
        group = [rank % 2, rank % 2 + 2]
        p2p = (expected("send", range(4), 32, peer=rank + 2) if rank < 2
               else expected("recv", range(4), 32, peer=rank - 2))
        check_contract(calls, [expected("all_reduce", group, 32), p2p], "the traced calls",
                       rank=rank)


WANTED = [expected("all_reduce", [0, 2], 512)]


@pytest.mark.parametrize("calls, words", [
    ([], "no all_reduce of 512 bytes over ranks [0, 2], which the formula asks for"),
    (WANTED * 2, "an extra all_reduce of 512 bytes over ranks [0, 2]"),
    ([expected("all_reduce", [0, 1, 2, 3], 512)], "where the formula asks for all_reduce of 512 "
                                                  "bytes over ranks [0, 2] (another group)"),
    ([expected("all_reduce", [0, 2], 1024)], "(2 times the bytes)"),
    ([expected("all_gather", [0, 2], 512)], "an extra all_gather"),
])
def test_each_difference_is_named(calls, words):
    with pytest.raises(AssertionError, match="on rank 1 communicates other than") as error:
        check_contract(calls, WANTED, "the forward", rank=1)
    assert words in str(error.value)


def test_the_same_operations_in_another_order_pass():
    wanted = WANTED + [expected("isend", range(4), 64, peer=3)]
    assert contract_violations(list(reversed(wanted)), wanted) == []
    check_contract(list(reversed(wanted)), wanted, "the step")
