"""The planner against published training runs (published_runs.py cites each): median
|error| within 10%, every predicted row within 20%; what was fitted is checked too."""
import pytest

from reference_impl.perf.planner.cli import main
from reference_impl.perf.planner.hardware import A100_E_GEMM
from reference_impl.perf.planner.published_runs import NARAYANAN, PUBLISHED_RUNS
from reference_impl.perf.planner.validation import (TARGET_MAX, TARGET_MEDIAN, compare,
                                                    fit_a100_ceiling, summary)

COMPARISONS = compare()


def test_every_narayanan_row_and_the_sources_are_there():
    assert sum(r.source == NARAYANAN for r in PUBLISHED_RUNS) == 10
    assert {r.source.split(" ")[0] for r in PUBLISHED_RUNS} >= {"Narayanan", "Korthikanti",
                                                                 "Dubey", "torchtitan", "NeMo"}


def test_the_targets_hold():
    median, largest = summary(COMPARISONS)
    assert median <= TARGET_MEDIAN, f"median |error| {median:.1%}"
    assert largest <= TARGET_MAX, f"largest |error| {largest:.1%}"


@pytest.mark.parametrize("comparison", COMPARISONS, ids=lambda c: c.run.name)
def test_each_row_is_predicted_or_says_why_not(comparison):
    if comparison.predicted is None:
        assert comparison.run.not_predicted
    else:
        assert abs(comparison.error) <= TARGET_MAX, comparison.row()


def test_the_one_fitted_a100_number_is_the_fit():
    assert fit_a100_ceiling() == pytest.approx(A100_E_GEMM, abs=0.005)


def test_validate_prints_every_row(capsys):
    main(["--validate"])
    out = capsys.readouterr().out
    for run in PUBLISHED_RUNS:
        assert run.name in out
    assert "median |error|" in out
