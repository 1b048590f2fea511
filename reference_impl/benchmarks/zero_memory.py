"""ZeRO memory: model-state bytes per rank, measured, next to the course's formulas.

    python -m reference_impl.benchmarks.zero_memory [--hidden 252 --heads 6 --layers 2 --vocab 512]

A GPT of about two million parameters on N = 1, 2, 4, 8 gloo ranks, plain Adam and ZeRO stages
1-3 (``hybrid.zero.ZeroOptimizer``): the bytes each rank holds against the fp32 formula (to the
byte) and the paper's mixed-precision one (Rajbhandari et al. 2020). Memory only: nothing is
timed. The formulas: docs/library.md, 'Hybrid and 3D parallelism'.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.model import GPT, ModelConfig
from reference_impl.hybrid.zero import ZeroOptimizer, model_state_bytes, padded_numel
from reference_impl.memory.model_states import zero_memory_formula

WORLD_SIZES = (1, 2, 4, 8)
STAGES = (0, 1, 2, 3)
LAUNCH_TIMEOUT = 300.0


def measure_on_rank(config: ModelConfig) -> dict[int, dict[str, int]]:
    """Bytes of model states this rank holds after one training step, per ZeRO stage."""
    measured, device = {}, current_device()
    for stage in STAGES:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = GPT(config).to(device)
        if stage == 0:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        else:
            optimizer = ZeroOptimizer(model, stage=stage, lr=1e-3)
        generator = torch.Generator().manual_seed(dist.get_rank())  # each rank its own data
        tokens = torch.randint(config.vocab_size, (2, config.seq_len), generator=generator)
        tokens = tokens.to(device)
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        if stage == 0:  # plain data parallelism: average the gradients, step everything
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad.div_(dist.get_world_size())
        optimizer.step()
        measured[stage] = model_state_bytes(model, optimizer)
        if stage:
            optimizer.remove_hooks()
    return measured


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=252)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args(argv)
    config = ModelConfig(vocab_size=args.vocab, seq_len=args.seq, hidden=args.hidden,
                         heads=args.heads, layers=args.layers)
    num_params = sum(p.numel() for p in GPT(config).parameters())
    print(f"GPT: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}: "
          f"{num_params:,} parameters (Psi); Adam; one step, then measured on every rank")
    print("bytes of model states (parameters + gradients + optimizer states) per rank; "
          "formulas in bytes per parameter x Psi")
    print(f"{'N':>2}  {'stage':>5}  {'measured fp32':>13}  {'fp32 formula':>12}  "
          f"{'':>5}  {'bytes/param':>11}  {'fp32 per param':>14}  "
          f"{'mixed-precision formula':>23}  {'mixed per param':>15}")
    fp32_terms = {0: "16", 1: "8 + 8/N", 2: "4 + 12/N", 3: "16/N"}
    mixed_terms = {0: "16", 1: "4 + 12/N", 2: "2 + 14/N", 3: "16/N"}
    all_match = True
    for world_size in WORLD_SIZES:
        per_rank = launch(measure_on_rank, world_size, config, timeout=LAUNCH_TIMEOUT)
        padded = padded_numel(GPT(config), world_size)
        for stage in STAGES:
            totals = {result[stage]["total"] for result in per_rank}
            measured = per_rank[0][stage]["total"]
            formula = zero_memory_formula(num_params, world_size, stage, mixed_precision=False,
                                          padded_num_params=padded if stage else None)
            mixed = zero_memory_formula(num_params, world_size, stage, mixed_precision=True)
            match = totals == {formula}
            all_match &= match
            print(f"{world_size:>2}  {stage:>5}  {measured:>13,}  {formula:>12,}  "
                  f"{'match' if match else 'DIFFER':>5}  {measured / num_params:>11.3f}  "
                  f"{fp32_terms[stage]:>14}  {round(mixed):>23,}  {mixed_terms[stage]:>15}")
    print(f"\npadding: each parameter is padded to a multiple of N before sharding (at most "
          f"N - 1 elements each); at N = 8 that is {padded_numel(GPT(config), 8) - num_params} "
          "elements, in the fp32 formula's sharded part.")
    print("every rank's measurement equals the fp32 formula" if all_match
          else "SOME MEASUREMENTS DIFFER FROM THE FORMULA")


if __name__ == "__main__":
    main()
