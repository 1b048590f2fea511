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


def traced_all_to_alls():
    """On 4 ranks: an uneven all_to_all_single over the strided group holding this rank (rank r
    sends r + 1 rows of 3 floats to each member), then the list all_to_all over the world."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[rank % 2]
    theirs = [member + 1 for member in dist.get_process_group_ranks(group)]
    # gloo's all-to-all takes CPU tensors only (four ranks sharing one GPU run gloo)
    device = "cpu" if dist.get_backend() == "gloo" else None
    with CommTracer() as trace:
        rows = torch.ones(2 * (rank + 1), 3, device=device)
        received = torch.empty(sum(theirs), 3, device=device)
        dist.all_to_all_single(received, rows, output_split_sizes=theirs,
                               input_split_sizes=[rank + 1] * 2, group=group)
        outputs = [torch.empty(2, device=device) for _ in range(4)]
        dist.all_to_all(outputs, [torch.full((2,), float(rank), device=device) for _ in range(4)])
    return [call.as_data() for call in trace.calls]


def test_the_tracer_records_all_to_alls_with_their_whole_input(run_on_ranks):
    for rank, calls in enumerate(run_on_ranks(traced_all_to_alls, 4)):
        check_contract(calls, [expected("all_to_all_single", [rank % 2, rank % 2 + 2],
                                        2 * (rank + 1) * 3 * 4),
                               expected("all_to_all", range(4), 4 * 2 * 4)],
                       "the traced all-to-alls", rank=rank)


def positional_group_and_p2p_ops():
    """A group passed positionally, and P2POp built from the traced dist.isend/irecv."""
    rank = dist.get_rank()
    group = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    x = torch.ones(4)
    with CommTracer() as trace:
        dist.all_reduce(x, dist.ReduceOp.SUM, group)
        peer = rank ^ 2
        operations = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, torch.empty(4), peer)]
        for work in dist.batch_isend_irecv(operations):
            work.wait()
    return [call.as_data() for call in trace.calls]


def test_a_positional_group_and_p2p_ops_are_traced(run_on_ranks):
    for rank, calls in enumerate(run_on_ranks(positional_group_and_p2p_ops, 4)):
        peer = rank ^ 2
        check_contract(calls, [expected("all_reduce", [rank % 2, rank % 2 + 2], 16),
                               expected("isend", range(4), 16, peer=peer),
                               expected("irecv", range(4), 16, peer=peer)],
                       "the traced calls", rank=rank)
