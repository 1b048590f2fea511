"""Scaling (``reference_impl.perf.scaling``) at tiny sizes: the table, the plot
(``reference_impl.figures.scaling``) and the alpha-beta prediction with its error are produced.
Times are never asserted."""
import math

import pytest

from reference_impl.figures.scaling import main, plot_scaling
from reference_impl.perf.scaling import ScalingRow, format_table, measure


@pytest.fixture(scope="module")
def rows():
    return measure(sizes=(1, 2), hidden=16, heads=2, seq=8, batch=2, repeats=2)


def test_a_row_per_method_and_size(rows):
    assert [(r.method, r.n) for r in rows] == [("TP", 1), ("TP", 2), ("DP", 1), ("DP", 2),
                                               ("PP", 1), ("PP", 2)]
    for r in rows:
        assert r.strong_s > 0 and r.weak_s > 0
        assert (r.comm_s is None) == (r.method == "PP") and (r.comm_s is None or r.comm_s >= 0)
        assert math.isfinite(r.strong_eff) and math.isfinite(r.weak_eff)
    for method in ("TP", "DP", "PP"):
        base = next(r for r in rows if r.method == method and r.n == 1)
        assert base.strong_eff == pytest.approx(1.0) and base.weak_eff == pytest.approx(1.0)


def test_prediction_and_error_are_reported(rows):
    for r in rows:
        if r.n == 1 or r.method == "PP":  # PP communicates point to point: no all-reduce model
            assert r.predicted_s is None and r.error is None
        else:
            assert r.predicted_s is not None and math.isfinite(r.predicted_s)
            assert r.comm_s > 0 and math.isfinite(r.error)
    table = format_table(rows)
    assert "alpha-beta (ms)" in table and "error" in table and "%" in table


def test_plot_is_a_figure_with_two_panels(rows, tmp_path):
    figure = plot_scaling(rows, "tiny")
    assert len(figure.axes) == 2
    figure.savefig(tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_error_of_a_row():
    row = ScalingRow("DP", 2, 1.0, 0.5, 1.0, 1.0, comm_s=2.0, predicted_s=3.0)
    assert row.error == pytest.approx(0.5)


def test_cli_writes_the_plot(tmp_path, capsys):
    path = tmp_path / "plot.png"
    main(["--sizes", "1", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--batch", "2",
          "--repeats", "1", "--plot", str(path)])
    assert path.stat().st_size > 0
    assert "alpha-beta" in capsys.readouterr().out
