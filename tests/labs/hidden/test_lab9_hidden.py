"""Lab 9's hidden checks: the public checks' functions on the sweeps of other seeds (other
permuted group layouts, other draws of experts, k, capacities, dtypes, magnitudes, token
counts and split sizes, and the exchange's rows and gradients in other memory layouts), with the
same messages."""
import pytest

from test_lab9_expert_groups import check_groups
from test_lab9_moe import check_combine, check_dispatch, check_layer, check_router, \
    check_sync_alone
from test_lab9_token_exchange import check_exchange
from reference_impl.course.contracts import assert_contract
from test_lab9_contracts import CAPACITY, GROUPS, group_draws, routing_draws

pytestmark = pytest.mark.lab9
CONTRACT_SEED = 104729  # added to the sweep's seed: the contracts' other draws

SEEDS = (1, 2)      # the checks in one helper process: two more sweeps each
LAUNCH_SEED = 1     # the checks that launch 4 ranks: one more sweep each (a launch costs more)


@pytest.mark.parametrize("seed", SEEDS)
def test_hidden_groups(impl, run_alone, seed):
    check_groups(impl, run_alone, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_hidden_router(impl, run_alone, seed):
    check_router(impl, run_alone, seed)


def test_hidden_all_to_all(impl, run_on_ranks):
    check_exchange(impl, run_on_ranks, LAUNCH_SEED)


def test_hidden_sync_moe_grads(impl, run_on_ranks):
    check_sync_alone(impl, run_on_ranks, LAUNCH_SEED)


def test_hidden_dispatch(impl, run_on_ranks):
    check_dispatch(impl, run_on_ranks, LAUNCH_SEED)


def test_hidden_combine(impl, run_on_ranks):
    check_combine(impl, run_on_ranks, LAUNCH_SEED)


def test_hidden_layer(impl, run_on_ranks):
    check_layer(impl, run_on_ranks, LAUNCH_SEED)


def test_hidden_contracts_on_other_draws(impl, run_alone, sweep_seed):
    seed = sweep_seed + CONTRACT_SEED
    assert_contract(run_alone, impl, "router", "keep_within_capacity", CAPACITY,
                    routing_draws(seed, (3, 20)))
    assert_contract(run_alone, impl, "expert_groups", "expert_parallel_groups", GROUPS,
                    group_draws(seed, ((16, 8, 4), (6, 6, 2))))
