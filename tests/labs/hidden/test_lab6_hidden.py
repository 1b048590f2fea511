"""Lab 6, hidden checks: the public checks' functions on other traces, rank counts, seeds,
clock skews and rank orders."""
import pytest

from test_lab6_trace_analysis import (check_clocks, check_live_tp_block, check_made_traces,
                                      check_recorded_alignment, check_refusals, check_step,
                                      made_trace)
from reference_impl.course.contracts import assert_contract
from test_lab6_contracts import (RANK_TIME, STEP, STRAGGLER, span_draws, thread_draws,
                                wait_draws)

pytestmark = pytest.mark.lab6
CONTRACT_SEED = 104729  # added to the sweep's seed: the contracts' other draws


def test_hidden_traces_made_from_a_known_truth(impl, run_alone):
    check_made_traces(impl, run_alone, 31, worlds=(3, 8))


def test_hidden_step_time_and_efficiency(impl, run_alone):
    events, expected = made_trace(77, 4)
    slowest = max(rank["span_s"] for rank in expected)
    check_step(impl, run_alone, events, 3, slowest / 3,
               [(10.0, 1.0, 16), (10.0, 12.5, 1, True), (2.0, 0.25, 8, False), (7.0, 14.0, 2)],
               [0.625, 0.8, 1.0, 0.25])


def test_hidden_clocks_timeline_and_straggler(impl, run_alone):
    check_clocks(impl, run_alone, 5, worlds=(2, 5, 6))


def test_hidden_refusals(impl, run_alone):
    check_refusals(impl, run_alone, 9, world=4)


def test_hidden_recorded_tp_block_on_skewed_clocks(impl, run_alone):
    check_recorded_alignment(impl, run_alone, "hidden")


def test_hidden_real_trace_of_a_tp_block(impl, run_on_ranks, run_alone, tmp_path):
    check_live_tp_block(impl, run_on_ranks, run_alone, tmp_path, {0: -3.0, 1: 0.5})


def test_hidden_contracts_on_other_draws(impl, run_alone, sweep_seed):
    seed = sweep_seed + CONTRACT_SEED
    assert_contract(run_alone, impl, "trace_analysis", "rank_time", RANK_TIME, thread_draws(seed, (1, 4)))
    assert_contract(run_alone, impl, "trace_analysis", "step_seconds", STEP, span_draws(seed, (2, 8)))
    assert_contract(run_alone, impl, "trace_analysis", "straggler", STRAGGLER, wait_draws(seed, (2, 8)))
