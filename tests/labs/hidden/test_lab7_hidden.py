"""Lab 7, hidden checks: the public checks' functions on other shapes, degrees, stages,
pipelines, data-parallel collectives and layouts, and another seed for the refusals."""
import pytest

from test_lab7_capacity import (check_function, check_planner_step, check_planner_tp_time,
                                check_refusals)
from reference_impl.course.contracts import assert_contract
from test_lab7_contracts import BUBBLE, PIPELINE

pytestmark = pytest.mark.lab7
CONTRACT_SEED = 104729  # added to the sweep's seed: the contracts' other draws

FUNCTIONS = ("llama_parameters", "first_stage_parameters", "model_state_bytes_per_parameter",
             "activation_bytes_per_layer", "in_flight_microbatches", "bubble_fraction",
             "tp_all_reduce_bytes_per_layer", "tp_seconds_per_layer", "dp_exposed_seconds")


def test_hidden_terms(impl, run_alone):
    check_function(impl, run_alone, FUNCTIONS, "hidden")


def test_hidden_tp_time_against_the_planner(impl, run_alone):
    check_planner_tp_time(impl, run_alone, "hidden")


def test_hidden_step_against_the_planner(impl, run_alone):
    check_planner_step(impl, run_alone, "hidden")


def test_hidden_refusals(impl, run_alone):
    check_refusals(impl, run_alone, 2024)


OTHER_PIPELINES = {"pp 6, m 5": (6, 5, 1), "pp 2, m 64, v 4": (2, 64, 4), "pp 5, m 10, v 3": (5, 10, 3)}


def test_hidden_pipeline_contracts_on_other_sizes(impl, run_alone):
    assert_contract(run_alone, impl, "capacity", "bubble_fraction", BUBBLE, OTHER_PIPELINES)
    assert_contract(run_alone, impl, "capacity", "pipeline_seconds", PIPELINE,
                    {label: (1.5, *sizes) for label, sizes in OTHER_PIPELINES.items()})
