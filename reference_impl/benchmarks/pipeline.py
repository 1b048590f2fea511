"""Pipeline schedules measured: bubble, activation memory, timelines, and PyTorch's pipelining.

    python -m reference_impl.benchmarks.pipeline [--plot FILE] [--trace FILE] [--cost-f 0.03]
                                                 [--skip-torch]

The reference executor on p = 4 ranks: the bubble measured on calibrated sleeping stages against
the simulator and the formula, peak activations in flight, a Gantt chart and a Chrome trace, and
the executor timed against ``torch.distributed.pipelining`` (1F1B, interleaved, ZB-H1). Times are
printed, never asserted (``tests/library/pipeline/test_pipeline_measured.py`` asserts the
ratios). What each part measures and why: docs/library.md, 'Validating, simulating, splitting
the backward'.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device, wait_for_device
from reference_impl.comm.launcher import launch
from reference_impl.figures.pipeline_gantt import plot_gantt, save_chrome_trace
from reference_impl.model import GPT, ModelConfig
from reference_impl.pipeline.calibrated_stages import fitted_costs, run_sleeping
from reference_impl.pipeline.gpt_stages import build_gpt_stages, gpt_loss
from reference_impl.pipeline.named_schedules import build_schedule
from reference_impl.pipeline.pipeline_executor import measured_timeline, run_schedule, split_batch
from reference_impl.pipeline.pipeline_simulator import Timeline, bubble_formula, simulate

P = 4
MICROBATCHES = (4, 8, 16)
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))
LAUNCH_TIMEOUT = 300.0


def _measure_all(cases, cost_f, cost_b):
    return [run_sleeping(build_schedule(name, P, m, v), cost_f, cost_b)
            for name, v, m in cases]


# ---------------------------------------------------------------- PyTorch's pipelining

def _gpt_batch(config, batch):
    """The same random tokens and targets on every rank, on this rank's device."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch, config.seq_len), generator=generator)
    targets = torch.randint(0, config.vocab_size, (batch, config.seq_len), generator=generator)
    return tokens.to(current_device()), targets.to(current_device())


def _torch_step(runner, tokens, targets) -> None:
    """One step of a ``torch.distributed.pipelining`` schedule on this rank: the first stage
    (rank 0) takes the tokens, the last (rank p - 1, also with v chunks per rank) the targets."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        runner.step(tokens)
    elif rank == p - 1:
        runner.step(target=targets, losses=[])
    else:
        runner.step()


def _median_step_times(candidates, repeats) -> dict:
    """Per rank: (label, step function, its stage modules) timed in turns, a barrier before and
    after each step; the median of ``repeats`` steps each, after one warm-up."""
    samples = {label: [] for label, _, _ in candidates}
    for repeat in range(repeats + 1):
        for label, fn, modules in candidates:
            for module in modules.values():
                module.zero_grad(set_to_none=True)
            wait_for_device()
            dist.barrier()
            start = time.perf_counter()
            fn()
            wait_for_device()
            dist.barrier()
            if repeat:
                samples[label].append(time.perf_counter() - start)
    return {label: statistics.median(values) for label, values in samples.items()}


def _step_times(gpt, config, m, batch, repeats):
    """Per rank: the reference executor and torch.distributed.pipelining, alternately."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, p = dist.get_rank(), dist.get_world_size()
    device, (tokens, targets) = current_device(), _gpt_batch(config, batch)
    shape = (batch // m, config.seq_len, config.hidden)
    times = {}
    for name, torch_schedule in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        schedule = build_schedule(name, p, m)
        ours, _ = build_gpt_stages(gpt, schedule, rank)
        theirs, _ = build_gpt_stages(gpt, schedule, rank)
        stage = PipelineStage(theirs[rank], rank, p, device)
        runner = torch_schedule(stage, n_microbatches=m, loss_fn=gpt_loss)

        def reference():
            run_schedule(schedule, ours, split_batch(tokens, m), split_batch(targets, m),
                         gpt_loss, boundary_shape=shape)

        def pytorch():
            _torch_step(runner, tokens, targets)

        times[name] = _median_step_times(
            [("reference", reference, ours), ("pytorch", pytorch, theirs)], repeats)
    return times


def _gpt_schedule_times(gpt, config, m, batch, repeats, skip_torch):
    """Per rank: one training step of the GPT through 1F1B, interleaved 1F1B (v = 2) and ZB-H1,
    reference executor and (unless ``skip_torch``) PyTorch's schedule of the same name on the
    same stages. Every candidate is timed in turn within each repeat, so a slow moment of a
    noisy machine falls on all of them alike and the ratios hold; the medians and the
    executor's peak saved bytes."""
    from torch.distributed.pipelining import (
        PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)

    rank, p = dist.get_rank(), dist.get_world_size()
    device, (tokens, targets) = current_device(), _gpt_batch(config, batch)
    shape = (batch // m, config.seq_len, config.hidden)
    candidates, runs = [], {}
    for name, v, torch_schedule in (("1f1b", 1, Schedule1F1B),
                                    ("interleaved", 2, ScheduleInterleaved1F1B),
                                    ("zb-h1", 1, ScheduleInterleavedZeroBubble)):
        schedule = build_schedule(name, p, m, v)
        ours, _ = build_gpt_stages(gpt, schedule, rank)
        runs[name] = []

        def reference(schedule=schedule, ours=ours, into=runs[name]):
            into.append(run_schedule(schedule, ours, split_batch(tokens, m),
                                     split_batch(targets, m), gpt_loss, boundary_shape=shape))

        candidates.append(((name, "reference"), reference, ours))
        if not skip_torch:
            theirs, _ = build_gpt_stages(gpt, schedule, rank)
            stages = [PipelineStage(module, index, schedule.stages, device)
                      for index, module in sorted(theirs.items())]
            runner = torch_schedule(stages if v > 1 or name == "zb-h1" else stages[0],
                                    n_microbatches=m, loss_fn=gpt_loss)
            candidates.append(((name, "pytorch"),
                               lambda runner=runner: _torch_step(runner, tokens, targets), theirs))
    results = {name: {} for name in runs}
    for (name, implementation), seconds in _median_step_times(candidates, repeats).items():
        results[name][implementation] = seconds
    for name, done in runs.items():
        results[name]["peak_bytes"] = max(run.peak_saved_bytes for run in done)
    return results


# ---------------------------------------------------------------- the report

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plot", help="save the 1F1B Gantt chart (simulated vs measured) here")
    parser.add_argument("--trace", help="save the measured 1F1B timeline as a Chrome trace")
    parser.add_argument("--cost-f", type=float, default=0.03,
                        help="seconds a forward sleeps (the whole backward: twice that)")
    parser.add_argument("--skip-torch", action="store_true",
                        help="skip the comparison with torch.distributed.pipelining")
    args = parser.parse_args(argv)
    cost_f, cost_b = args.cost_f, 2 * args.cost_f

    print(f"pipeline benchmark: p={P} ranks (gloo on CPU, {os.cpu_count()} cores), "
          f"sleeping stages: T_F = {cost_f * 1e3:g} ms, whole backward {cost_b * 1e3:g} ms "
          f"(ZB-H1: B = W = {cost_b / 2 * 1e3:g} ms), 1/v of that per chunk")
    cases = [(name, v, m) for name, v in SCHEDULES for m in MICROBATCHES]
    started = time.perf_counter()
    per_rank = launch(_measure_all, P, cases, cost_f, cost_b, timeout=LAUNCH_TIMEOUT)
    print(f"(measured {len(cases)} runs in {time.perf_counter() - started:.1f} s)\n")

    print("1. bubble fraction = idle / (p * makespan)")
    print(f"{'schedule':<16}{'m':>4}{'measured':>10}{'simulated':>11}{'formula':>9}"
          f"{'meas/sim':>10}{'makespan meas/sim':>19}{'fitted sim':>12}")
    timelines = {}
    for index, (name, v, m) in enumerate(cases):
        schedule = build_schedule(name, P, m, v)
        measured = measured_timeline(schedule, [runs[index] for runs in per_rank])
        simulated = simulate(schedule, cost_f, cost_b)
        timelines[(name, m)] = (schedule, measured, simulated, [r[index] for r in per_rank])
        formula = bubble_formula(name, P, m, v, cost_f, cost_b)
        label = f"{name} v={v}" if v > 1 else name
        print(f"{label:<16}{m:>4}{measured.bubble_fraction:>10.3f}"
              f"{simulated.bubble_fraction:>11.3f}{formula:>9.3f}"
              f"{measured.bubble_fraction / simulated.bubble_fraction:>10.3f}"
              f"{measured.makespan / simulated.makespan:>19.3f}"
              f"{simulate(schedule, **fitted_costs(measured)).bubble_fraction:>12.3f}")

    print("\n2. activation memory: most (microbatch, stage) entries held, per rank "
          "(measured | simulator's peak_in_flight)")
    for name, v in SCHEDULES:
        for m in MICROBATCHES:
            schedule, _, simulated, runs = timelines[(name, m)]
            measured = [run.peak_saved for run in runs]
            label = f"{name} v={v}" if v > 1 else name
            note = ("  (unit: one chunk)" if v > 1 else
                    "  (entries kept from B until W)" if schedule.split_backward else "")
            print(f"{label:<16} m={m:<3} {str(measured):<18}| "
                  f"{str(list(simulated.peak_in_flight)):<18}{note}")

    schedule, measured, simulated, _ = timelines[("1f1b", 8)]
    if args.plot:
        in_seconds = Timeline(schedule, simulated.events, unit="s")  # costs were seconds
        figure = plot_gantt([in_seconds, measured],
                            titles=[f"simulated (T_F = {cost_f * 1e3:g} ms, "
                                    f"T_B = {cost_b * 1e3:g} ms)", "measured by the executor"])
        figure.savefig(args.plot, dpi=120)
        print(f"\n3. Gantt chart of 1F1B p={P} m=8, simulated vs measured: {args.plot}")
    if args.trace:
        save_chrome_trace(measured, args.trace)
        print(f"3. Chrome trace of the measured 1F1B p={P} m=8: {args.trace}")
    if not (args.plot or args.trace):
        print("\n3. (pass --plot FILE and/or --trace FILE for the 1F1B timelines)")

    print(f"\n4. one training step, reference executor vs torch.distributed.pipelining, "
          f"p={P}")
    config = ModelConfig(vocab_size=256, seq_len=64, hidden=128, heads=4, layers=6)
    m, batch, repeats = 8, 32, 3
    torch.manual_seed(0)
    gpt = GPT(config)
    skip_torch = args.skip_torch
    if skip_torch:
        print("skipped (--skip-torch)")
    else:
        try:
            times = launch(_step_times, P, gpt, config, m, batch, repeats,
                           timeout=LAUNCH_TIMEOUT)[0]
        except Exception as error:  # noqa: BLE001 - report, do not fail the whole benchmark
            print(f"skipped: torch.distributed.pipelining failed here: {error}".splitlines()[0])
            skip_torch = True
    if not skip_torch:
        print(f"GPT hidden {config.hidden}, {config.layers} blocks, seq {config.seq_len}, "
              f"batch {batch}, m={m}; median of {repeats} steps, 1 thread per rank")
        for name, label in (("gpipe", "ScheduleGPipe"), ("1f1b", "Schedule1F1B")):
            ours, theirs = times[name]["reference"], times[name]["pytorch"]
            print(f"{name:<6} reference {ours * 1e3:7.1f} ms   {label:<14}{theirs * 1e3:7.1f} "
                  f"ms   ratio reference/PyTorch {ours / theirs:.2f}")
    wider = ModelConfig(vocab_size=256, seq_len=64, hidden=256, heads=4, layers=6)
    torch.manual_seed(0)
    gpt_schedules(GPT(wider), wider, batch, repeats + 1, skip_torch)


def gpt_schedules(gpt, config, batch, repeats, skip_torch) -> None:
    print(f"\n5. the GPT (hidden {config.hidden}, {config.layers} blocks, seq {config.seq_len}, "
          f"batch {batch}) through 1F1B, interleaved (v = 2) and ZB-H1, m = 2p microbatches; "
          f"median of {repeats} steps, every candidate in turn; peak = most bytes autograd "
          f"held for the backward on one rank")
    labels = {"1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
              "zb-h1": "ScheduleInterleavedZeroBubble"}
    cores = os.cpu_count() or 1
    for p in (2, 4):
        if p > cores:  # the ranks would take turns on the cores: nothing to learn, and slow
            print(f"p={p}: skipped, {cores} cores (the ranks would share them, and a bubble "
                  "would cost nothing)")
            continue
        results = launch(_gpt_schedule_times, p, gpt, config, 2 * p, batch, repeats, skip_torch,
                         timeout=LAUNCH_TIMEOUT)[0]
        for name, row in results.items():
            torch_part = (f"   {labels[name]:<30}{row['pytorch'] * 1e3:7.1f} ms   ratio "
                          f"{row['reference'] / row['pytorch']:.2f}" if "pytorch" in row else "")
            print(f"p={p} m={2 * p} {name:<12} reference {row['reference'] * 1e3:7.1f} ms  peak "
                  f"{row['peak_bytes'] / 2**20:6.1f} MiB{torch_part}")
        print(f"p={p} ZB-H1 / 1F1B step time: "
              f"{results['zb-h1']['reference'] / results['1f1b']['reference']:.2f}")


if __name__ == "__main__":
    main()
