"""Lab 2, hidden checks: the public checks' functions on other seeds (other numbers, other
permuted layouts), other sizes and other shard layouts, with the same messages."""
import pytest

from test_lab2_sagemaker_linear import (check_communication, check_data_parallel, check_refusal,
                                        data_parallel_and_distributed, traced_calls)
from test_lab2_tp_layers import (check_collective_on_every_layout, check_compositions,
                                 check_layers_on_every_layout, check_shard)
from test_lab2_unshard import check_on_every_layout
from reference_impl.course.contracts import assert_contract
from test_lab2_contracts import SHARD, shard_draws

pytestmark = pytest.mark.lab2
CONTRACT_SEED = 104729  # added to the sweep's seed: the contracts' other draws

SEEDS = (101, 202)
OTHER_SHARDS = [(18, 0, 3, 3), (16, 1, 4, 2), (36, 1, 3, 2), (9, 0, 3, 1), (40, 0, 4, 2)]
OTHER_SIZES = [(24, 0, 3, "bf16"), (40, 1, 2, "fp32"), (4, 0, 1, "fp32"), (48, 0, 3, "fp32")]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["copy_to_tp", "reduce_from_tp"])
def test_collectives_on_other_seeds(impl, run_on_ranks, name, seed):
    check_collective_on_every_layout(run_on_ranks, impl, name, seed)


def test_shard_on_other_layouts(impl, run_alone):
    check_shard(run_alone, impl, OTHER_SHARDS)


@pytest.mark.parametrize("seed", SEEDS[:1])
def test_layers_on_another_seed(impl, run_on_ranks, seed):
    check_layers_on_every_layout(run_on_ranks, impl, seed)


@pytest.mark.parametrize("seed", SEEDS[:1])
def test_compositions_on_another_seed(impl, run_on_ranks, seed):
    check_compositions(run_on_ranks, impl, seed)


@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_parameter_and_unshard_on_other_sizes(impl, run_on_ranks, tp):
    check_on_every_layout(impl, run_on_ranks, tp, SEEDS[1], OTHER_SIZES)


@pytest.mark.parametrize("tp", [2, 4])
def test_distributed_linear_on_other_sizes_and_three_steps(impl, run_on_ranks, tp):
    results = run_on_ranks(data_parallel_and_distributed, 4, impl, tp, SEEDS[0], 3, (24, 7))
    check_data_parallel(results, tp, SEEDS[0], steps=3)


def test_distributed_linear_refuses_other_sizes(impl, run_on_ranks):
    check_refusal(run_on_ranks, impl, 6, 8)


def test_distributed_linear_communication_on_other_sizes(impl, run_on_ranks):
    sizes = (8, 3)
    check_communication(run_on_ranks(traced_calls, 4, impl, 2, SEEDS[1], sizes), 2, SEEDS[1],
                        sizes)


def test_hidden_shard_contract_on_other_shapes(impl, run_alone, sweep_seed):
    assert_contract(run_alone, impl, "tp_layers", "shard", SHARD,
                    shard_draws(sweep_seed + CONTRACT_SEED, ((12, 8), (3, 12, 2), (8,))))
