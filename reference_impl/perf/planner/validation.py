"""Predicted against published: every run of ``published_runs`` through the planner.

For each run the layout is the published one; what the source leaves out (micro-batch size,
interleaving) the planner picks, the fastest layout that fits, the same rule for every row. The
predicted throughput is counted with the source's own FLOP formula, so predicted / published
is the published step time over the predicted one. Nothing is fitted per row; what was fitted,
to what, is in ``hardware.py``: the H100's five numbers to the H100 calibration table, and one
number, the A100 GEMM ceiling, to Narayanan et al.'s ten rows (:func:`fit_a100_ceiling`).

Memory: every run of ``reported_memory`` with its published layout, the estimate of the
counter the source reports (the reserved peak, or the allocated one) against the reported peak
(:func:`compare_memory`, :func:`memory_report`); ``MEMORY_TOLERANCE`` is the test's bound.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from reference_impl.perf.planner.hardware import GPUS, GiB, cluster_of
from reference_impl.perf.planner.layout import MICRO_BATCHES, Layout, virtual_stages
from reference_impl.perf.planner.plans import Plan, evaluate
from reference_impl.perf.planner.published_runs import NARAYANAN, PUBLISHED_RUNS, PublishedRun
from reference_impl.perf.planner.reported_memory import RESERVED, REPORTED_PEAKS, ReportedPeak

TARGET_MEDIAN = 0.10
TARGET_MAX = 0.20
MEMORY_TOLERANCE = 0.10


@dataclass(frozen=True)
class Comparison:
    run: PublishedRun
    plan: Plan | None
    predicted: float | None

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.run.published - 1

    def row(self) -> str:
        r = self.run
        unit = "%" if r.metric == "mfu" else " TF"
        scale = 100 if r.metric == "mfu" else 1
        layout = f"TP{r.tp} PP{r.pp}{f' CP{r.cp}' if r.cp > 1 else ''} DP{r.dp}"
        head = f"{r.name:<31} {r.gpus:>6} {r.gpu.upper():<5} {layout:<19}"
        if self.predicted is None:
            return f"{head} {'-':>8} {r.published * scale:>7.1f}{unit}  {'-':>6}  {r.not_predicted}"
        lay = self.plan.layout
        chosen = f"mb {lay.micro_batch}, v {lay.v}, {self.plan.memory_bytes / GiB:.0f} GiB"
        if not self.plan.fits:
            chosen += " (over memory)"
        return (f"{head} {self.predicted * scale:>7.1f}{unit} {r.published * scale:>7.1f}{unit}"
                f" {self.error:>+6.1%}  {chosen}")


def run_plans(run: PublishedRun, gpu=None) -> list[Plan]:
    """The run's layout with each micro-batch and interleaving the source leaves open."""
    cluster = cluster_of(run.gpu, run.gpus // 8)
    if gpu is not None:
        cluster = replace(cluster, gpu=gpu)
    micro_batches = (run.micro_batch,) if run.micro_batch else MICRO_BATCHES
    interleavings = ((run.v,) if run.v else
                     virtual_stages(run.model, run.pp, run.embedding_in_split))
    plans = []
    for b in micro_batches:
        if run.global_batch % (run.dp * b):
            continue
        for v in interleavings:
            layout = Layout(run.tp, run.pp, run.dp, run.zero, b, run.recompute,
                            run.sequence_parallel, run.cp, v, run.accounting, run.attention,
                            embedding_in_split=run.embedding_in_split)
            plans.append(evaluate(run.model, cluster, layout, run.global_batch))
    return plans


def predict(run: PublishedRun, gpu=None) -> Comparison:
    if run.not_predicted:
        return Comparison(run, None, None)
    plans = run_plans(run, gpu)
    fitting = [p for p in plans if p.fits] or plans
    best = min(fitting, key=lambda p: p.step_s)
    flops_per_gpu_s = run.flops(run.model, run.global_batch) / best.step_s / run.gpus
    if run.metric == "mfu":
        predicted = flops_per_gpu_s / best.cluster.gpu.layer.peak_flops
    else:
        predicted = flops_per_gpu_s / 1e12
    return Comparison(run, best, predicted)


def compare(runs=PUBLISHED_RUNS) -> list[Comparison]:
    return [predict(run) for run in runs]


def summary(comparisons: list[Comparison]) -> tuple[float, float]:
    """Median and largest absolute error over the rows that are predicted."""
    errors = [abs(c.error) for c in comparisons if c.error is not None]
    return statistics.median(errors), max(errors)


def grouped_rows(comparisons, heading) -> list[str]:
    """Each comparison's row, under a "-- heading" line wherever the heading changes."""
    lines, last = [], None
    for c in comparisons:
        if heading(c.run) != last:
            last = heading(c.run)
            lines.append(f"-- {last}")
        lines.append(c.row())
    return lines


def report(comparisons: list[Comparison] | None = None) -> str:
    comparisons = compare() if comparisons is None else comparisons
    median, largest = summary(comparisons)
    lines = [f"{'run':<31} {'GPUs':>6} {'GPU':<5} {'layout':<19} {'predicted':>9} "
             f"{'published':>9} {'error':>6}  planner's choice / note"]
    lines += grouped_rows(comparisons, lambda run: run.source)
    scored = sum(c.error is not None for c in comparisons)
    lines.append(f"{scored} rows predicted: median |error| {median:.1%} (target "
                 f"{TARGET_MEDIAN:.0%}), largest {largest:.1%} (target {TARGET_MAX:.0%})")
    return "\n".join(lines)


def fit_a100_ceiling(low: float = 0.5, high: float = 0.95, steps: int = 30) -> float:
    """The A100 GEMM ceiling that best fits Narayanan et al.'s Table 1 (least squares on the
    log of predicted / published), by golden-section search: the one number fitted to
    published runs."""
    runs = [r for r in PUBLISHED_RUNS if r.source == NARAYANAN]
    h100 = GPUS["h100"].layer

    def loss(e):
        gpu = replace(GPUS["a100"], layer=h100.for_device("A100", 312e12, 2.04e12, e, ""))
        return sum(math.log(predict(r, gpu).predicted / r.published) ** 2 for r in runs)

    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    for _ in range(steps):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if loss(c) < loss(d):
            b = d
        else:
            a = c
    return (a + b) / 2


@dataclass(frozen=True)
class MemoryComparison:
    run: ReportedPeak
    plan: Plan | None

    @property
    def predicted_gib(self) -> float | None:
        """The estimate of the counter the source reports."""
        if self.plan is None:
            return None
        memory = self.plan.memory
        counted = memory.total_bytes if self.run.counter == RESERVED else memory.allocated_bytes
        return counted / GiB

    @property
    def ratio(self) -> float | None:
        return None if self.plan is None else self.predicted_gib / self.run.reported_gib

    def row(self) -> str:
        r = self.run
        layout = (f"TP{r.tp} PP{r.pp}{f' CP{r.cp}' if r.cp > 1 else ''} DP{r.dp} mb{r.micro_batch}"
                  f" s{r.model.seq_len // 1024}K {r.recompute or 'no AC'}")
        head = f"{r.name:<47} {layout:<32} {r.reported_gib:>6.1f}"
        if self.plan is None:
            return f"{head} {'-':>6} {'-':>6}  {r.not_predicted}"
        unmodelled = [name for name, on in (("compile", r.compiled), ("Float8", r.float8)) if on]
        note = f"priced without {' and '.join(unmodelled)}" if unmodelled else ""
        usable = self.plan.cluster.usable_bytes / GiB
        fit = "fits" if self.plan.fits else "DOES NOT FIT"
        return (f"{head} {self.predicted_gib:>6.1f} {self.ratio:>6.3f}  {fit} in {usable:.1f}"
                f" GiB{f'; {note}' if note else ''}")


def memory_plan(run: ReportedPeak) -> Plan:
    """The run's layout on its GPUs, one microbatch per step (local batch = micro-batch)."""
    layout = Layout(run.tp, run.pp, run.dp, run.zero, run.micro_batch, run.recompute,
                    cp=run.cp, accounting=run.accounting)
    return evaluate(run.model, cluster_of(run.gpu, run.gpus // 8), layout,
                    run.dp * run.micro_batch)


def compare_memory(runs=REPORTED_PEAKS) -> list[MemoryComparison]:
    return [MemoryComparison(run, None if run.not_predicted else memory_plan(run))
            for run in runs]


def memory_report(comparisons: list[MemoryComparison] | None = None) -> str:
    comparisons = compare_memory() if comparisons is None else comparisons
    lines = [f"{'run (reported peak memory per GPU, GiB)':<47} {'layout':<32} {'report':>6} "
             f"{'plan':>6} {'ratio':>6}  fits / note"]
    lines += grouped_rows(comparisons, lambda run: f"{run.source} ({run.counter})")
    ratios = [c.ratio for c in comparisons if c.ratio is not None]
    lines.append(f"{len(ratios)} rows predicted: ratios {min(ratios):.3f} to {max(ratios):.3f} "
                 f"(bound {1 - MEMORY_TOLERANCE:.2f} to {1 + MEMORY_TOLERANCE:.2f})")
    return "\n".join(lines)
