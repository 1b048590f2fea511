"""Lab 7, hidden checks: the public checks' functions on other shapes, degrees, stages,
pipelines, data-parallel collectives and layouts, and another seed for the refusals."""
import pytest

from test_lab7_capacity import (check_function, check_planner_step, check_planner_tp_time,
                                check_refusals)

pytestmark = pytest.mark.lab7

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
