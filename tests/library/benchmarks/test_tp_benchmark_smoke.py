"""The TP block benchmark runs end to end on tiny shapes: it prints the reference/DTensor ratio,
the strong-scaling table with its efficiencies, the bytes check ("match": CommTracer's bytes
equal the formula 2 x b*s*h*4 each way), and writes its PNG. Times are never asserted."""
import pytest
import torch

from reference_impl.benchmarks import tp_block
from support.printed_tables import is_number, section


@pytest.mark.slow  # the benchmark's command line, end to end
def test_tp_block_benchmark_prints_every_measurement_and_plots(capsys, tmp_path, backend):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < max(tp_block.TP_DEGREES):
        pytest.skip(f"needs {max(tp_block.TP_DEGREES)} GPUs for nccl, this machine has {gpus}")
    plot = tmp_path / "scaling.png"
    tp_block.main(["--hidden", "16", "--heads", "4", "--seq", "8", "--batch", "2",
                   "--repeats", "1", "--backend", backend, "--plot", str(plot)])
    out = capsys.readouterr().out

    assert "os.cpu_count() =" in out and "thread(s) per rank" in out, out
    assert "reference/DTensor" in out, out
    ratio_rows = section(out, "DTensor (ms)")
    assert [row.split()[0] for row in ratio_rows] == ["2", "4"], out
    assert all(is_number(row.split()[3]) for row in ratio_rows), out  # the ratio, any value

    assert "efficiency T1/(tp*Ttp)" in out, out
    scaling_rows = section(out, "efficiency T1/(tp*Ttp)")
    assert [row.split()[0] for row in scaling_rows] == ["1", "2", "4"], out
    # tp, ranks "x" threads, time, speed-up, efficiency (then maybe an oversubscription note)
    speed_up, efficiency = scaling_rows[0].split()[5:7]
    assert (speed_up, efficiency) == ("1.00", "1.00"), "at tp = 1, T1 / (1 * T1) is 1.00"
    assert all(is_number(row.split()[6]) for row in scaling_rows), out

    bytes_rows = section(out, "DTensor all-reduces fwd/bwd")
    assert [row.split()[0] for row in bytes_rows] == ["2", "4"], out
    expected = str(2 * 2 * 8 * 16 * 4)  # 2 all-reduces of b*s*h fp32 elements each way
    for row in bytes_rows:
        tp, forward, formula, backward, formula_again, dtensor, verdict = row.split()
        assert forward == backward == formula == formula_again == expected, row
        assert dtensor == "2/2" and verdict == "match", row

    assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "no PNG written"
