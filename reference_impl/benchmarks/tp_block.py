"""Tensor-parallel transformer block: the reference against DTensor, strong scaling, bytes moved.

    python -m reference_impl.benchmarks.tp_block [--hidden 256 --heads 8 --seq 128 --batch 4
                                                  --repeats 5 --threads 1 --plot FILE]

One training step of a block (fp32): the reference ``ParallelBlock`` against DTensor's
``parallelize_module`` on the same weights, strong scaling for tp = 1, 2, 4 with the
single-device block as the baseline, and the bytes all-reduced against the formula. Times are
printed, never asserted. Details and the machine's caveats: docs/library.md, 'Tensor
parallelism'.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.model import Block, ModelConfig
from reference_impl.perf.step_timing import median_step_seconds
from reference_impl.tp.tp_attention import ParallelBlock
from reference_impl.tp.tp_dtensor import dtensor_block

TP_DEGREES = (1, 2, 4)
LAUNCH_TIMEOUT = 300.0  # seconds; a default run takes well under a minute


# ------------------------------------------------------------------------ measuring, per rank

def measure_on_rank(hidden: int, heads: int, seq: int, batch: int, repeats: int) -> dict:
    """Run on every rank of a launch: time the reference TP block (and, at tp > 1, the DTensor
    block; at tp = 1, the single-device Block), and trace the reference block's all-reduces."""
    device, tp = current_device(), dist.get_world_size()
    torch.manual_seed(0)  # the same weights, input and upstream gradient on every rank
    block = Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device)
    x = torch.randn(batch, seq, hidden).to(device).requires_grad_()
    upstream = torch.randn(batch, seq, hidden).to(device)
    modules = {"reference": ParallelBlock(block)}
    if tp == 1:
        modules["single-device"] = block
    else:
        modules["dtensor"] = dtensor_block(block, init_device_mesh(device.type, (tp,)))
    result = {"seconds": median_step_seconds(modules, x, upstream, repeats)}

    with CommTracer() as forward:
        y = modules["reference"](x)
    with CommTracer() as backward:
        y.backward(upstream)
    result["reference_all_reduce_bytes"] = [t.total_bytes("all_reduce")
                                            for t in (forward, backward)]
    result["reference_collectives"] = [t.summary() for t in (forward, backward)]
    if "dtensor" in modules:
        counts = []
        with CommDebugMode() as mode:
            y = modules["dtensor"](x)
        counts.append(mode.get_total_counts())
        with CommDebugMode() as mode:
            y.backward(upstream)
        counts.append(mode.get_total_counts())
        result["dtensor_collectives"] = counts
    return result


def all_reduce_bytes_formula(batch: int, seq: int, hidden: int, bytes_per_element: int = 4) -> int:
    """Bytes all-reduced by a Megatron TP block in one direction (forward, or backward):
    2 all-reduces of the activation, b * s * h elements."""
    return 2 * batch * seq * hidden * bytes_per_element


# ------------------------------------------------------------------------------- reporting

def plot_scaling(rows: list[tuple[int, float, float]], path: str, title: str,
                 threads: int = 1) -> None:
    """Time per step and efficiency against tp, to a PNG (a matplotlib Figure, no pyplot);
    the tp values whose ranks x threads exceed this machine's cores are shaded."""
    from reference_impl.figures.style import GREY_50, GRID_ALPHA, HIGHLIGHT, new_figure

    tps = [tp for tp, _, _ in rows]
    milliseconds = [1e3 * seconds for _, seconds, _ in rows]
    efficiencies = [efficiency for _, _, efficiency in rows]
    figure = new_figure(9, 3.8)
    time_axes, efficiency_axes = figure.subplots(1, 2)
    time_axes.plot(tps, milliseconds, "o-", label="measured")
    time_axes.plot(tps, [milliseconds[0] / tp for tp in tps], "--", color=GREY_50,
                   label="ideal  T1 / tp")
    time_axes.set(xlabel="tensor-parallel size tp", ylabel="time per step (ms)",
                  title="forward + backward, one block", xticks=tps)
    time_axes.set_ylim(bottom=0)
    efficiency_axes.plot(tps, efficiencies, "o-", label="measured")
    efficiency_axes.axhline(1.0, linestyle="--", color=GREY_50, label="ideal")
    efficiency_axes.set(xlabel="tensor-parallel size tp", ylabel="efficiency  T1 / (tp · Ttp)",
                        title="strong-scaling efficiency", xticks=tps,
                        ylim=(0, max(1.1, max(efficiencies) * 1.1)))
    cores = os.cpu_count() or 1
    oversubscribed = [tp for tp in tps if tp * threads > cores]
    for axes in (time_axes, efficiency_axes):
        if oversubscribed:
            axes.axvspan(min(oversubscribed) - 0.5, max(tps) + 0.5, color=HIGHLIGHT, alpha=0.08,
                         label=f"ranks x threads > {cores} cores")
        axes.set_xlim(min(tps) - 0.5, max(tps) + 0.5)
        axes.grid(alpha=GRID_ALPHA)
        axes.legend(loc="best", fontsize="small")
    figure.suptitle(title)
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per module (median)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--plot", metavar="FILE",
                        help="write the strong-scaling plot to FILE (PNG)")
    args = parser.parse_args(argv)
    shape = (args.hidden, args.heads, args.seq, args.batch)

    cores = os.cpu_count()
    print(f"TP block: hidden {args.hidden}, heads {args.heads}, seq {args.seq}, batch "
          f"{args.batch}, fp32; forward + backward, median of {args.repeats} steps")
    print(f"os.cpu_count() = {cores}, {args.threads} intra-op thread(s) per rank"
          + (f"; tp = {max(TP_DEGREES)} oversubscribes the cores" if cores and
             cores < max(TP_DEGREES) * args.threads else ""))

    results = {}  # tp -> rank 0's measurements
    for tp in TP_DEGREES:
        results[tp] = launch(measure_on_rank, tp, *shape, args.repeats, backend=args.backend,
                             threads=args.threads, timeout=LAUNCH_TIMEOUT)[0]

    print("\nreference ParallelBlock vs DTensor parallelize_module (same ranks, same weights, "
          "timed alternately; target reference/DTensor <= 1)")
    print(f"{'tp':>4}  {'reference (ms)':>14}  {'DTensor (ms)':>12}  {'reference/DTensor':>17}")
    for tp in TP_DEGREES[1:]:
        seconds = results[tp]["seconds"]
        print(f"{tp:>4}  {1e3 * seconds['reference']:>14.2f}  {1e3 * seconds['dtensor']:>12.2f}  "
              f"{seconds['reference'] / seconds['dtensor']:>17.2f}")

    t1 = results[1]["seconds"]["reference"]
    rows = []
    print("\nstrong scaling of the reference TP block (same global problem at every tp)")
    print(f"{'tp':>4}  {'ranks x threads':>15}  {'time/step (ms)':>14}  {'speed-up':>8}  "
          f"{'efficiency T1/(tp*Ttp)':>22}")
    for tp in TP_DEGREES:
        seconds = results[tp]["seconds"]["reference"]
        rows.append((tp, seconds, t1 / (tp * seconds)))
        oversubscribed = cores is not None and tp * args.threads > cores
        print(f"{tp:>4}  {f'{tp} x {args.threads}':>15}  {1e3 * seconds:>14.2f}  "
              f"{t1 / seconds:>8.2f}  {t1 / (tp * seconds):>22.2f}"
              + (f"  (more threads than {cores} cores)" if oversubscribed else ""))
    single = results[1]["seconds"]["single-device"]
    print(f"single-device model.Block: {1e3 * single:.2f} ms "
          f"(reference at tp = 1 / Block = {t1 / single:.2f})")

    expected = all_reduce_bytes_formula(args.batch, args.seq, args.hidden)
    print("\nbytes all-reduced per block per step, per rank (CommTracer) vs the formula "
          "2 x b*s*h*4 each way")
    print(f"{'tp':>4}  {'forward':>9}  {'formula':>9}  {'backward':>9}  {'formula':>9}  "
          f"{'DTensor all-reduces fwd/bwd':>27}  bytes")
    for tp in TP_DEGREES[1:]:
        forward, backward = results[tp]["reference_all_reduce_bytes"]
        dtensor = "/".join(str(c) for c in results[tp]["dtensor_collectives"])
        only_two_all_reduces = all(summary == {"all_reduce": 2}
                                   for summary in results[tp]["reference_collectives"])
        verdict = "match" if forward == backward == expected and only_two_all_reduces else "DIFFER"
        print(f"{tp:>4}  {forward:>9}  {expected:>9}  {backward:>9}  {expected:>9}  "
              f"{dtensor:>27}  {verdict}")

    if args.plot:
        plot_scaling(rows, args.plot, f"TP block, hidden {args.hidden}, seq {args.seq}, batch "
                     f"{args.batch}; {cores} cores, {args.threads} thread(s) per rank",
                     args.threads)
        print(f"\nplot written to {args.plot}")


if __name__ == "__main__":
    main()
