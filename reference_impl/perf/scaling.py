"""Strong and weak scaling of TP attention, of the pipeline and of data parallelism, and an
alpha-beta prediction of the communication.

    python -m reference_impl.perf.scaling [--sizes 1 2 4 --hidden 128 --heads 8 --seq 64 --batch 8
                                      --repeats 5 --dtype fp32|bf16 --attention explicit|sdpa]

``python -m reference_impl.figures.scaling --plot FILE`` (the same options) also plots them.
Efficiency T_1 / (N T_N) strong, T_1 / T_N weak; bf16 and sdpa on GPUs by default
(:func:`default_kernels`). What each measures: docs/library.md, 'Profiling, scaling and
planning a layout'.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from reference_impl.comm.alpha_beta import fit_alpha_beta, ring_all_reduce_seconds, time_all_reduce
from reference_impl.perf.step_timing import median_step_seconds
from reference_impl.perf.trace_analysis import scaling_efficiency
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device, resolve_backend, wait_for_device
from reference_impl.comm.launcher import launch
from reference_impl.model import ATTENTION_KERNELS, GPT, Block, ModelConfig
from reference_impl.pipeline.pipeline_executor import pipeline_train_step
from reference_impl.model.precision import PRECISIONS, Autocast
from reference_impl.tp.tp_attention import ParallelBlock

FIT_SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20)  # bytes of the fitted all-reduces


class AllReduceTimer:
    """While active, time every ``dist.all_reduce`` on this rank (seconds summed)."""

    def __enter__(self):
        self.seconds, self._original = 0.0, dist.all_reduce

        def timed(*args, **kwargs):
            wait_for_device()
            start = time.perf_counter()
            result = self._original(*args, **kwargs)
            wait_for_device()
            self.seconds += time.perf_counter() - start
            return result
        dist.all_reduce = timed
        return self

    def __exit__(self, *exc_info):
        dist.all_reduce = self._original


def _slowest(values: list[float]) -> float:
    """The median over repeats, then the max over ranks (a step is as slow as its slowest rank)."""
    value = torch.tensor([statistics.median(values)], dtype=torch.float64,
                         device=current_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def _fit(n: int, repeats: int):
    if n == 1:
        return None
    seconds = time_all_reduce(list(FIT_SIZES), repeats=repeats)
    return fit_alpha_beta(list(FIT_SIZES), seconds, n)


def default_kernels(backend: str) -> tuple[str, str]:
    """(precision, attention kernel) for ranks on ``backend``: ("bf16", "sdpa") on GPUs (NCCL),
    ("fp32", "explicit") on CPU ranks (gloo)."""
    return ("bf16", "sdpa") if backend == "nccl" else ("fp32", "explicit")


def tp_on_rank(hidden: int, heads: int, seq: int, batch: int, repeats: int,
               precision: str = "fp32", attention: str = "explicit") -> dict:
    """Strong and weak TP step times on N ranks, the all-reduce bytes and the measured comm."""
    device, n = current_device(), dist.get_world_size()
    torch.manual_seed(0)
    config = ModelConfig(hidden=hidden, heads=heads, seq_len=seq, attention=attention)
    block = Autocast(ParallelBlock(Block(config).to(device)), precision)
    result = {"n": n, "fit": _fit(n, repeats)}
    for mode, b in (("strong", batch), ("weak", batch * n)):
        x = torch.randn(b, seq, hidden).to(device).requires_grad_()
        upstream = torch.randn(b, seq, hidden).to(device)
        result[mode] = median_step_seconds({"tp": block}, x, upstream, repeats)["tp"]
        if mode == "strong":
            with CommTracer() as tracer:
                block(x).backward(upstream)
            result["all_reduce_bytes"] = [c.nbytes for c in tracer.calls if c.op == "all_reduce"]
            comm = []
            for _ in range(repeats):
                dist.barrier()
                with AllReduceTimer() as timer:
                    block(x).backward(upstream)
                comm.append(timer.seconds)
            result["comm"] = _slowest(comm)
    return result


def dp_on_rank(hidden: int, heads: int, seq: int, batch: int, repeats: int,
               precision: str = "fp32", attention: str = "explicit") -> dict:
    """Strong (global ``batch`` split) and weak (``batch`` per rank) DP step times, the gradient
    bytes (fp32 in either precision) and the measured all-reduce time of a step."""
    device, n = current_device(), dist.get_world_size()
    torch.manual_seed(0)
    config = ModelConfig(hidden=hidden, heads=heads, seq_len=seq, attention=attention)
    block = Autocast(Block(config).to(device), precision)
    parameters = list(block.parameters())
    result = {"n": n, "fit": _fit(n, repeats),
              "grad_bytes": sum(p.numel() * p.element_size() for p in parameters)}

    def step(x):
        block.zero_grad(set_to_none=True)
        block(x).sum().backward()
        flat = torch.cat([p.grad.reshape(-1) for p in parameters])
        dist.all_reduce(flat)

    for mode, b in (("strong", max(1, batch // n)), ("weak", batch)):
        x = torch.randn(b, seq, hidden).to(device)
        step(x)  # warm-up
        times, comm = [], []
        for _ in range(repeats):
            wait_for_device()
            dist.barrier()
            with AllReduceTimer() as timer:
                start = time.perf_counter()
                step(x)
                wait_for_device()
            times.append(time.perf_counter() - start)
            comm.append(timer.seconds)
        result[mode] = _slowest(times)
        if mode == "strong":
            result["comm"] = _slowest(comm)
    return result


def pp_on_rank(hidden: int, heads: int, seq: int, batch: int, repeats: int,
               precision: str = "fp32", attention: str = "explicit") -> dict:
    """Strong and weak step times of a 1F1B pipeline over the N ranks: a GPT of 2 blocks a
    stage (``pipeline_executor.pipeline_train_step``, N microbatches). *Strong*: 4 blocks at
    every N (N <= 6) and the global ``batch``; *weak*: 2 blocks per rank, so the model grows
    with N. Its communication is point-to-point, not all-reduces: no alpha-beta row."""
    n = dist.get_world_size()
    result = {"n": n, "fit": None, "comm": None}
    for mode, layers in (("strong", 4), ("weak", 2 * n)):
        torch.manual_seed(0)
        gpt = GPT(ModelConfig(vocab_size=64, seq_len=seq, hidden=hidden, heads=heads,
                              layers=layers, attention=attention))
        tokens = torch.randint(0, 64, (batch, seq))
        pipeline_train_step(gpt, "1f1b", tokens, tokens, microbatches=n,
                            precision=precision)  # warm-up
        times = []
        for _ in range(repeats):
            wait_for_device()
            dist.barrier()
            start = time.perf_counter()
            pipeline_train_step(gpt, "1f1b", tokens, tokens, microbatches=n,
                                precision=precision)
            wait_for_device()
            times.append(time.perf_counter() - start)
        result[mode] = _slowest(times)
    return result


@dataclass(frozen=True)
class ScalingRow:
    method: str         # "TP" or "DP"
    n: int              # ranks
    strong_s: float     # time per step, same global problem
    strong_eff: float   # T1 / (N * TN)
    weak_s: float       # time per step, problem grown with N
    weak_eff: float     # T1 / TN
    comm_s: float | None  # measured all-reduce time in a (strong) step (None: PP)
    predicted_s: float | None  # alpha-beta prediction of comm_s (None at N = 1)

    @property
    def error(self) -> float | None:
        if self.predicted_s is None or not self.comm_s:  # also PP: no all-reduces
            return None
        return (self.predicted_s - self.comm_s) / self.comm_s


def predicted_comm(result: dict, method: str) -> float | None:
    """The alpha-beta model's communication time of one step, from the fitted alpha and B."""
    if result["fit"] is None:
        return None
    alpha, bandwidth = result["fit"]
    sizes = result["all_reduce_bytes"] if method == "TP" else [result["grad_bytes"]]
    return sum(ring_all_reduce_seconds(size, result["n"], alpha, bandwidth) for size in sizes)


def measure(sizes=(1, 2, 4), hidden=128, heads=8, seq=64, batch=8, repeats=5,
            backend="auto", threads=1, precision=None, attention=None) -> list[ScalingRow]:
    """Launch every method at every size; one :class:`ScalingRow` per (method, N).
    ``precision`` and ``attention`` default to :func:`default_kernels` of the backend."""
    defaults = default_kernels(resolve_backend(backend, max(sizes)))
    precision, attention = precision or defaults[0], attention or defaults[1]
    rows = []
    for method, on_rank in (("TP", tp_on_rank), ("DP", dp_on_rank), ("PP", pp_on_rank)):
        results = [launch(on_rank, n, hidden, heads, seq, batch, repeats, precision, attention,
                          backend=backend, threads=threads, timeout=300.0)[0] for n in sizes]
        base = results[0]  # sizes[0] is the baseline, normally 1
        for result in results:
            n = result["n"] / base["n"]
            rows.append(ScalingRow(
                method, result["n"], result["strong"],
                scaling_efficiency(base["strong"], result["strong"], n), result["weak"],
                scaling_efficiency(base["weak"], result["weak"], n, weak=True), result["comm"],
                predicted_comm(result, method)))
    return rows


def format_table(rows: list[ScalingRow]) -> str:
    lines = [f"{'method':>6}  {'N':>3}  {'strong (ms)':>11}  {'eff T1/(N*TN)':>13}  "
             f"{'weak (ms)':>9}  {'eff T1/TN':>9}  {'comm (ms)':>9}  {'alpha-beta (ms)':>15}  "
             f"{'error':>7}"]
    for r in rows:
        predicted = "-" if r.predicted_s is None else f"{1e3 * r.predicted_s:.3f}"
        comm = "-" if r.comm_s is None else f"{1e3 * r.comm_s:.3f}"
        error = "-" if r.error is None else f"{r.error:+.0%}"
        lines.append(f"{r.method:>6}  {r.n:>3}  {1e3 * r.strong_s:>11.2f}  {r.strong_eff:>13.2f}  "
                     f"{1e3 * r.weak_s:>9.2f}  {r.weak_eff:>9.2f}  {comm:>9}  "
                     f"{predicted:>15}  {error:>7}")
    return "\n".join(lines)


def scaling_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of a measurement (:func:`measure_and_print` runs it);
    ``figures.scaling`` adds the file its plot goes to."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--dtype", choices=PRECISIONS, default=None,
                        help="default bf16 on GPUs, fp32 on CPU ranks")
    parser.add_argument("--attention", choices=ATTENTION_KERNELS, default=None,
                        help="default sdpa on GPUs, explicit on CPU ranks")
    return parser


def measure_and_print(args: argparse.Namespace) -> list[ScalingRow]:
    """Measure what the parsed command line asks for, print the table, return its rows."""
    defaults = default_kernels(resolve_backend(args.backend, max(args.sizes)))
    precision, attention = args.dtype or defaults[0], args.attention or defaults[1]
    rows = measure(tuple(args.sizes), args.hidden, args.heads, args.seq, args.batch,
                   args.repeats, args.backend, args.threads, precision, attention)
    print(f"block hidden {args.hidden}, heads {args.heads}, seq {args.seq}, batch {args.batch}, "
          f"{precision}, attention {attention}; os.cpu_count() = {os.cpu_count()}, "
          f"{args.threads} thread(s) per rank")
    print(format_table(rows))
    return rows


def main(argv: list[str] | None = None) -> None:
    measure_and_print(scaling_parser().parse_args(argv))


if __name__ == "__main__":
    main()
