"""Tokens/s of 3D-parallel training against pure data parallelism, on the same ranks and model.

    python -m reference_impl.benchmarks.hybrid_throughput [--steps 6 --hidden 64 --layers 4]

Each layout (dp x tp x pp) trains the same GPT on the same batches with the reference trainer
(``reference_impl.train``, here without torchrun: CPU ranks, gloo); the first step is a
warm-up and not timed. Printed: tokens/s and the ratio to pure data parallelism (dp = all
ranks) measured in the same run, and the losses' agreement (every layout trains the same model,
so its losses must be the same). On a 2-core machine 8 ranks oversubscribe the cores: the
ratios say how much each layout communicates, not how fast a GPU cluster would be.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os

from reference_impl.train import main as train

LAYOUTS = ((8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 2, 4), (2, 1, 4))  # (dp, tp, pp)


def tokens_per_second(dp, tp, pp, args) -> tuple[float, list[float]]:
    common = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--hidden", str(args.hidden),
              "--heads", "4", "--layers", str(args.layers), "--seq", "32", "--vocab", "128",
              "--batch", "16", "--microbatches", str(2 if pp > 1 else 1),
              "--log-every", str(10 ** 6)]
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer's own progress lines
        warm = train(common + ["--steps", "1"])
        timed = train(common + ["--steps", str(args.steps + 1)])
    seconds = timed["seconds"] - warm["seconds"]  # the same first step, measured alone above
    return args.steps * 16 * 32 / seconds, timed["losses"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    print(f"GPT hidden {args.hidden}, {args.layers} blocks, batch 16 x seq 32 tokens a step, "
          f"8 CPU ranks on {os.cpu_count()} cores, {args.steps} timed steps")
    print(f"{'dp x tp x pp':>13}  {'tokens/s':>9}  {'vs pure DP':>10}  losses as pure DP")
    baseline = baseline_losses = None
    for dp, tp, pp in LAYOUTS:
        rate, losses = tokens_per_second(dp, tp, pp, args)
        baseline = baseline or rate
        baseline_losses = baseline_losses or losses
        same = max(abs(a - b) for a, b in zip(losses, baseline_losses)) < 1e-4
        print(f"{f'{dp} x {tp} x {pp}':>13}  {rate:>9.0f}  {rate / baseline:>9.2f}x  "
              f"{'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
