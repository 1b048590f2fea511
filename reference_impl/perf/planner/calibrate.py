"""Measure the layer-efficiency calibration table on this machine's GPU, save it, fit it.

    python -m reference_impl.perf.planner calibrate --out my_gpu.json    # a few minutes on a GPU
    python -m reference_impl.perf.planner calibrate --dry-run             # tiny shapes, CPU
    python -m reference_impl.perf.planner calibrate --cluster-terms       # calibrate_cluster.py

One transformer layer (RMSNorm, fused QKV with grouped-query attention through
``scaled_dot_product_attention`` (causal), output projection, RMSNorm, SwiGLU MLP) at the shapes
ONE rank of a TP group holds (heads/t, kv_heads/t, ffn/t), forward + backward in bf16, mean of
6 steps after 2 warm-ups, for each shape, sequence, micro-batch and t of the table. No
communication: the compute side only, as in ``data/h100_layer_efficiency.json``. The saved file
is what ``layer_efficiency.fit`` reads (``--table`` on the planner's command line uses it).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from reference_impl.perf.planner import calibrate_cluster
from reference_impl.perf.planner.hardware import peak_tflops as datasheet_peak
from reference_impl.perf.planner.layer_efficiency import (CALIBRATION_SHAPES, describe, fit,
                                                          fit_errors)
from reference_impl.perf.planner.layer_workload import TINY, layer_step
from reference_impl.perf.planner.model_spec import ModelSpec
from reference_impl.perf.step_timing import mean_seconds

FULL_GRID = dict(shapes=("llama-7b", "llama3-70b", "gpt3-175b"), seqs=(2048, 4096, 8192),
                 micro_batches=(1, 2, 4), tps=(1, 2, 4, 8))
DRY_RUN_GRID = dict(shapes=("tiny",), seqs=(32, 64), micro_batches=(1, 2), tps=(1, 2))


def layer_flops(shape: ModelSpec, seq: int, micro_batch: int, tp: int) -> float:
    """6 x local layer parameters x tokens + 12 b s^2 h / t (the table's convention)."""
    local = sum(k * n for k, n in shape.layer_gemms(tp))
    return 6 * local * micro_batch * seq + 12 * micro_batch * seq * seq * shape.hidden / tp


def measure_row(shape: ModelSpec, seq: int, micro_batch: int, tp: int, device, dtype,
                warmups: int = 2, steps: int = 6) -> float:
    """Mean seconds of one layer's forward + backward."""
    return mean_seconds(layer_step(shape, seq, micro_batch, tp, device, dtype), device,
                        warmups, steps)


def calibrate(out: Path, dry_run: bool = False, peak_tflops: float | None = None) -> dict:
    """Measure the grid (the full one on a GPU, tiny shapes on the CPU with ``dry_run``), save
    the table to ``out`` and return it."""
    if dry_run:
        device, dtype, grid, steps = torch.device("cpu"), torch.float32, DRY_RUN_GRID, (1, 2)
        name, peak = "cpu (dry run)", (peak_tflops or 1.0)
        shapes = {"tiny": TINY}
    else:
        if not torch.cuda.is_available():
            raise SystemExit("calibrate needs a CUDA GPU; --dry-run runs tiny shapes on the CPU")
        device, dtype, grid, steps = torch.device("cuda"), torch.bfloat16, FULL_GRID, (2, 6)
        name = torch.cuda.get_device_name(device)
        peak = peak_tflops or datasheet_peak(name, "bf16")
        if peak is None:
            raise SystemExit(f"no known peak for {name!r}: pass --peak-tflops")
        shapes = CALIBRATION_SHAPES
    rows = []
    for shape_name in grid["shapes"]:
        for seq in grid["seqs"]:
            for mb in grid["micro_batches"]:
                for tp in grid["tps"]:
                    shape = shapes[shape_name]
                    seconds = measure_row(shape, seq, mb, tp, device, dtype, *steps)
                    tflops = layer_flops(shape, seq, mb, tp) / seconds / 1e12
                    rows.append(dict(model=shape_name, seq=seq, mb=mb, tp=tp,
                                     ms=round(seconds * 1e3, 3), tflops=round(tflops, 3),
                                     frac_peak=round(tflops / peak, 4)))
    table = dict(device=name, torch=torch.__version__, peak=peak * 1e12, rows=rows)
    out.write_text(json.dumps(table, indent=1))
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.perf.planner calibrate",
        description="Measure one layer's forward + backward at TP-local shapes and fit the "
                    "planner's layer-efficiency model to it.")
    parser.add_argument("--out", type=Path, default=Path("layer_efficiency.json"))
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense BF16 peak")
    parser.add_argument("--memory-bandwidth", type=float, default=3350.0,
                        help="GB/s of the GPU's memory (for the elementwise term)")
    parser.add_argument("--cluster-terms", action="store_true",
                        help="measure a layer with a concurrent all-reduce and the clock under "
                             "load instead (calibrate_cluster.py; torchrun for a real group)")
    args = parser.parse_args(argv)
    if args.cluster_terms:
        print(calibrate_cluster.report(calibrate_cluster.measure(args.dry_run)))
        return
    table = calibrate(args.out, args.dry_run, args.peak_tflops)
    print(f"{len(table['rows'])} rows measured on {table['device']}, saved to {args.out}")
    for row in table["rows"]:
        print(f"  {row['model']:<11} seq {row['seq']:>5} mb {row['mb']} tp {row['tp']}: "
              f"{row['ms']:>9.3f} ms, {row['frac_peak']:.3f} of peak")
    shapes = {"tiny": TINY} if args.dry_run else None
    model = fit(table, args.memory_bandwidth * 1e9, f"fitted to {args.out}", shapes)
    errors = fit_errors(model, table, shapes)
    print(f"fitted: {describe(model)}")
    print(f"fit: largest |error| {max(map(abs, errors)):.1%} over {len(errors)} rows")
