"""The layer-efficiency model: the shipped H100 numbers are the fit of the shipped table, the
shape effects the table shows, and the calibration command (its CPU dry run)."""
import json

import pytest

from reference_impl.perf.planner.calibrate import main as calibrate_main
from reference_impl.perf.planner.hardware import H100_LAYER
from reference_impl.perf.planner.layer_efficiency import (H100_TABLE, fit, fit_errors,
                                                          load_table)
from reference_impl.perf.planner.model_spec import get_model


def test_the_shipped_h100_numbers_fit_the_shipped_table():
    table = load_table(H100_TABLE)
    errors = [abs(e) for e in fit_errors(H100_LAYER, table)]
    assert len(errors) == 96
    assert sorted(errors)[48] < 0.03 and max(errors) < 0.15
    refit = fit(table, H100_LAYER.memory_bandwidth)
    assert refit.e_gemm == pytest.approx(H100_LAYER.e_gemm, rel=0.01)
    assert refit.launch_floor_s == pytest.approx(H100_LAYER.launch_floor_s, rel=0.01)


def test_more_tp_lowers_the_fraction_of_peak():
    model = get_model("70b")
    flops = [6 * 4096 * sum(k * n for k, n in model.layer_gemms(t)) for t in (1, 8)]
    rate = [f / H100_LAYER.layer_seconds(model, t, 1) for f, t in zip(flops, (1, 8))]
    assert rate[1] < 0.9 * rate[0]


def test_calibrate_dry_run_measures_saves_and_fits(tmp_path, capsys):
    out = tmp_path / "table.json"
    calibrate_main(["--dry-run", "--out", str(out)])
    table = json.loads(out.read_text())
    assert table["device"] == "cpu (dry run)" and len(table["rows"]) == 8
    assert all(row["ms"] > 0 for row in table["rows"])
    assert "fitted:" in capsys.readouterr().out
