"""What autocast adds to a layer (``perf/planner/autocast_cost.py``): the two byte counts are
the least-squares fit of the stored measurements, and they sit above the traffic counted by
hand (casting kernels run below the memory bandwidth), never below it."""
import pytest

from reference_impl.perf.planner.autocast_cost import (ACTIVATION_BYTES, PARAMETER_BYTES,
                                                       autocast_seconds, fit_autocast_bytes,
                                                       load_autocast_table)
from reference_impl.perf.planner.model_spec import ModelSpec

COUNTED_PARAMETER_BYTES, COUNTED_ACTIVATION_BYTES = 12, 58  # the module docstring's count


def test_the_constants_are_the_fit_of_the_table():
    parameter_bytes, activation_bytes = fit_autocast_bytes(load_autocast_table())
    assert parameter_bytes == pytest.approx(PARAMETER_BYTES, rel=0.01)
    assert activation_bytes == pytest.approx(ACTIVATION_BYTES, rel=0.01)


def test_the_fit_is_above_the_counted_traffic():
    assert PARAMETER_BYTES >= COUNTED_PARAMETER_BYTES
    assert ACTIVATION_BYTES >= COUNTED_ACTIVATION_BYTES


def test_the_cost_scales_with_weights_tokens_and_bandwidth():
    model = ModelSpec("gpt", 1, 2048, 16, 50304, 2048, ffn_hidden=8192)
    one = autocast_seconds(model, 3.35e12, tp=1, micro_batch=1)
    weights = sum(k * n for k, n in model.layer_gemms(1))
    assert one == pytest.approx((PARAMETER_BYTES * weights + ACTIVATION_BYTES * 2048 * 2048)
                                / 3.35e12)
    assert autocast_seconds(model, 6.7e12, tp=1, micro_batch=1) == pytest.approx(one / 2)
    # tp 2 halves the weights a rank casts, not the tokens or the hidden size
    assert autocast_seconds(model, 3.35e12, tp=2, micro_batch=1) == pytest.approx(
        (PARAMETER_BYTES * weights / 2 + ACTIVATION_BYTES * 2048 * 2048) / 3.35e12)
