"""The context-parallel benchmark runs end to end on tiny sizes: it prints the time table (ring,
all-gather and one device, with ratios), the bytes table (every row "match": CommTracer's bytes
equal cp_costs' formulas), the ring's hidden shares (in [0, 1]) and PyTorch's context_parallel
row (a time or the reason it was skipped). Times are never asserted."""
import pytest
import torch

from reference_impl.benchmarks import context_parallel
from support.printed_tables import is_number, section


def test_context_parallel_benchmark_prints_every_measurement(capsys, backend):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < 4:
        pytest.skip(f"needs 4 GPUs for nccl, this machine has {gpus}")
    context_parallel.main(["--batch", "1", "--seq", "16", "--hidden", "16", "--heads", "4",
                           "--kv-heads", "2", "--cp", "2", "4", "--repeats", "1", "--backend", backend])
    out = capsys.readouterr().out

    times = section(out, "ring/allgather")
    assert [row.split()[0] for row in times] == ["2", "4"], out
    assert all(len(row.split()) == 7 and all(is_number(cell) for cell in row.split()) for row in times), out

    rows = section(out, "verdict")
    assert [row.split()[:2] for row in rows] == [["2", "ring"], ["2", "allgather"], ["4", "ring"],
                                                  ["4", "allgather"]], out
    block = 2 * 1 * 2 * 4 * 4 * 4  # K and V, batch 1, 2 KV heads, 4 tokens per rank at cp 4, head_dim 4, fp32
    assert rows[2].split()[2:] == [str(3 * block)] * 2 + [str(6 * block)] * 2 + ["match"], out
    assert all(row.split()[-1] == "match" for row in rows), out

    shares = section(out, "mean over ranks")
    assert [row.split()[0] for row in shares] == ["2", "4"], out
    assert len(shares[1].split()) == 2 + 3, "cp 4: the mean and 3 steps of rank 0"
    assert all(0.0 <= float(cell) <= 1.0 for row in shares for cell in row.split()[1:]), out

    torch_rows = section(out, "PyTorch's context_parallel")
    assert [row.split()[0] for row in torch_rows] == ["2", "4"], out
    assert all("skipped: " in row or "max |diff| from one device" in row for row in torch_rows), out
