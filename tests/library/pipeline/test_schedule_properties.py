"""Every schedule the kit builds, over the whole space of its sizes and pass costs (drawn by
hypothesis, a property-based generator), not only the cases written out elsewhere: it passes
the validator (complete, in order on each rank, no deadlock, matching sends and receives), and
its simulated makespan is the closed form the lab teaches, wherever the module docstring of
``pipeline_simulator`` says the closed form holds, and never shorter outside it."""
import pytest
from hypothesis import given, settings, strategies as st

from reference_impl.pipeline.named_schedules import build_schedule
from reference_impl.pipeline.pipeline_simulator import makespan_formula, simulate
from reference_impl.pipeline.pipeline_validator import validate

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)
COSTS = st.floats(min_value=0.25, max_value=4.0, allow_nan=False)


@SETTINGS
@given(name=st.sampled_from(["gpipe", "1f1b"]), p=st.integers(1, 8), m=st.integers(1, 16),
       cost_f=COSTS, cost_b=COSTS)
def test_gpipe_and_1f1b_meet_their_closed_form_at_any_size(name, p, m, cost_f, cost_b):
    schedule = build_schedule(name, p, m)
    validate(schedule, rendezvous=True)
    simulated = simulate(schedule, cost_f, cost_b).makespan
    assert simulated == pytest.approx(makespan_formula(name, p, m, 1, cost_f, cost_b))


@SETTINGS
@given(p=st.integers(2, 6), groups=st.integers(1, 3), v=st.integers(2, 4), cost_f=COSTS,
       cost_b=COSTS)
def test_interleaved_meets_its_closed_form_when_m_is_a_multiple_of_p(p, groups, v, cost_f,
                                                                     cost_b):
    m = groups * p
    schedule = build_schedule("interleaved", p, m, v)
    validate(schedule, rendezvous=True)
    simulated = simulate(schedule, cost_f, cost_b).makespan
    assert simulated == pytest.approx(makespan_formula("interleaved", p, m, v, cost_f, cost_b))


@SETTINGS
@given(p=st.integers(1, 6), m=st.integers(1, 12), cost_f=COSTS, cost_b=COSTS,
       w_share=st.floats(min_value=0.05, max_value=0.95))
def test_zb_h1_meets_its_closed_form_where_it_holds_and_is_never_shorter(p, m, cost_f, cost_b,
                                                                          w_share):
    cost_w = w_share * cost_b
    schedule = build_schedule("zb-h1", p, m)
    validate(schedule, rendezvous=True)
    simulated = simulate(schedule, cost_f, cost_b, cost_w).makespan
    formula = makespan_formula("zb-h1", p, m, 1, cost_f, cost_b, cost_w)
    t_b = cost_b - cost_w  # the input-gradient part of the backward
    if m >= p and cost_w <= min(cost_f, t_b):
        assert simulated == pytest.approx(formula)
    else:
        assert simulated >= formula - 1e-9 * formula
