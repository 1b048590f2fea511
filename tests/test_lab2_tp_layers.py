"""Lab 2, graded: Megatron's autograd collectives, the column- and row-parallel linear layers
and the TP MLP, each against its single-device original.

Tolerances (fp32): the TP layers only change the order of additions, so outputs, gradients and
weights after a step agree to atol 1e-5 (observed: a few 1e-7); the collectives alone are
checked to 1e-6.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from reference_impl.checks import assert_close
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.equivalence import assert_equivalent, one_step_pairs
from reference_impl.comm.launcher import current_device
from reference_impl.model import MLP

pytestmark = pytest.mark.lab2

ATOL = 1e-5


def per_rank_tensor(shape, rank, requires_grad=True):
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(shape, generator=generator).requires_grad_(requires_grad)


def through_pair(impl, name):
    """Send rank r's own x_r through the collective; backward with rank r's own g_r."""
    collectives = impl.module("tp_collectives")
    rank, device = dist.get_rank(), current_device()
    x = per_rank_tensor((3, 4), rank, requires_grad=False).to(device).requires_grad_()
    y = getattr(collectives, name)(x)
    upstream = per_rank_tensor((3, 4), 50 + rank, requires_grad=False).to(device)
    y.backward(upstream)
    return y.detach(), x.grad


@pytest.mark.parametrize("world_size", [2, 4])
def test_copy_to_tp_is_identity_forward_all_reduce_backward(impl, run_on_ranks, world_size):
    results = run_on_ranks(through_pair, world_size, impl, "copy_to_tp")
    summed_upstream = sum(per_rank_tensor((3, 4), 50 + r, False) for r in range(world_size))
    for rank, (output, input_grad) in enumerate(results):
        assert_close(output, per_rank_tensor((3, 4), rank, False), "copy_to_tp's output",
                     rank=rank, atol=1e-6, likely_cause="the forward must return x unchanged")
        assert_close(input_grad, summed_upstream, "copy_to_tp's input gradient", rank=rank,
                     atol=1e-6, likely_cause="the backward must all-reduce (sum) the gradient "
                                             "over the group")


@pytest.mark.parametrize("world_size", [2, 4])
def test_reduce_from_tp_is_all_reduce_forward_identity_backward(impl, run_on_ranks, world_size):
    results = run_on_ranks(through_pair, world_size, impl, "reduce_from_tp")
    summed_inputs = sum(per_rank_tensor((3, 4), r, False) for r in range(world_size))
    for rank, (output, input_grad) in enumerate(results):
        assert_close(output, summed_inputs, "reduce_from_tp's output", rank=rank, atol=1e-6,
                     likely_cause="the forward must all-reduce (sum) x over the group")
        assert_close(input_grad, per_rank_tensor((3, 4), 50 + rank, False),
                     "reduce_from_tp's input gradient", rank=rank, atol=1e-6,
                     likely_cause="the backward must pass the gradient on unchanged (an "
                                  "all-reduce here would multiply it by the group size)")


def linear_pairs(impl, kind, in_features, out_features, **options):
    device = current_device()
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features).to(device)
    parallel = getattr(impl.module("tp_layers"), kind)(linear, **options)
    return one_step_pairs(linear, parallel, torch.randn(2, 5, in_features).to(device))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_column_parallel_linear_with_gathered_output(impl, run_on_ranks, world_size):
    assert_equivalent(run_on_ranks(linear_pairs, world_size, impl, "ColumnParallelLinear", 6, 8,
                                   gather_output=True), atol=ATOL)


def column_slice(impl, in_features, out_features):
    device = current_device()
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features).to(device)
    parallel = impl.module("tp_layers").ColumnParallelLinear(linear)
    x = torch.randn(2, 5, in_features).to(device)
    n, rank = dist.get_world_size(), dist.get_rank()
    return parallel(x).detach(), linear(x).detach().chunk(n, dim=-1)[rank]


def test_column_parallel_linear_keeps_its_slice_of_the_output(impl, run_on_ranks):
    for rank, (local, expected) in enumerate(run_on_ranks(column_slice, 2, impl, 6, 8)):
        assert_close(local, expected, "ColumnParallelLinear's output (gather_output=False)",
                     rank=rank, atol=ATOL, likely_cause="rank r must compute output columns "
                     "r*out/tp to (r+1)*out/tp, and not gather them")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_row_parallel_linear_splitting_its_input(impl, run_on_ranks, world_size):
    assert_equivalent(run_on_ranks(linear_pairs, world_size, impl, "RowParallelLinear", 8, 6,
                                   input_is_parallel=False), atol=ATOL)


def mlp_pairs(impl, hidden):
    device = current_device()
    torch.manual_seed(0)
    mlp = MLP(hidden, 4 * hidden).to(device)
    return one_step_pairs(mlp, impl.module("tp_layers").ParallelMLP(mlp),
                          torch.randn(3, 5, hidden).to(device))


@pytest.mark.parametrize("world_size, hidden", [(1, 8), (2, 8), (4, 16)])
def test_tp_mlp_matches_the_single_device_mlp(impl, run_on_ranks, world_size, hidden):
    assert_equivalent(run_on_ranks(mlp_pairs, world_size, impl, hidden), atol=ATOL)


def mlp_collectives(impl):
    device = current_device()
    torch.manual_seed(0)
    mlp = impl.module("tp_layers").ParallelMLP(MLP(8, 32).to(device))
    x = torch.randn(2, 5, 8).to(device).requires_grad_()
    with CommTracer() as forward:
        y = mlp(x)
    with CommTracer() as backward:
        y.sum().backward()
    return forward.summary(), backward.summary()


def test_tp_mlp_does_one_all_reduce_each_way(impl, run_on_ranks):
    for rank, (forward, backward) in enumerate(run_on_ranks(mlp_collectives, 2, impl)):
        assert forward == {"all_reduce": 1}, (
            f"rank {rank}: the TP MLP's forward ran {forward}; Megatron's runs one all-reduce "
            "(after fc2), none between fc1 and fc2")
        assert backward == {"all_reduce": 1}, (
            f"rank {rank}: the TP MLP's backward ran {backward}; Megatron's runs one all-reduce "
            "(of the input gradient, in copy_to_tp before fc1)")
