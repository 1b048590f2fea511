"""The MoE layer: its step time beside simpler ways to compute the same thing, and what expert
parallelism sends and how evenly it loads the experts.

    python -m reference_impl.benchmarks.moe_layer [--hidden 128 --ffn 512 --experts 8 --top-k 2
                                                   --tokens 256 --capacity-factor 1.25
                                                   --steps 10 --world-sizes 2 4]

The MoE layer against every expert on every token, a loop over (token, slot) and a dense MLP of
the same active parameters; then EP on CPU ranks: load per expert, imbalance, and all-to-all
bytes equal to ``moe_costs.all_to_all_bytes``. Times are printed, never asserted. Details:
docs/library.md, 'Beyond the three dimensions'.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.model import MLP
from reference_impl.comm.expert_groups import create_expert_groups
from reference_impl.moe.expert_parallel import ExpertParallelMoE
from reference_impl.moe.moe_costs import all_to_all_bytes, load_imbalance, relative_load
from reference_impl.moe.moe_layer import MoELayer
from reference_impl.perf.step_timing import mean_seconds

LAUNCH_TIMEOUT = 120.0
EXCHANGES = ("dispatch forward", "combine forward", "dispatch backward", "combine backward")


# --------------------------------------------------------------------- the simpler variants

def every_expert_masked(layer: MoELayer, tokens: torch.Tensor) -> torch.Tensor:
    """Each expert on all T tokens, times its combine weight (0 where it was not chosen or
    the assignment was dropped)."""
    routing = layer.router(tokens)
    combine = torch.zeros(tokens.shape[0], layer.num_experts, dtype=tokens.dtype,
                          device=tokens.device)
    combine = combine.scatter_add(1, routing.expert_index, routing.weight * routing.kept)
    return sum(combine[:, e:e + 1] * expert(tokens) for e, expert in enumerate(layer.experts))


def loop_over_tokens(layer: MoELayer, tokens: torch.Tensor) -> torch.Tensor:
    """y_t = sum over kept slots s of w_ts * expert_{e_ts}(x_t), one call per (token, slot)."""
    routing = layer.router(tokens)
    experts, kept = routing.expert_index.tolist(), routing.kept.tolist()
    rows = []
    for t, x_t in enumerate(tokens):
        y_t = torch.zeros_like(x_t)
        for s, expert in enumerate(experts[t]):
            if kept[t][s]:
                y_t = y_t + routing.weight[t, s] * layer.experts[expert](x_t)
        rows.append(y_t)
    return torch.stack(rows)


def step_seconds(forward, parameters: list[nn.Parameter], tokens: torch.Tensor, steps: int) -> float:
    upstream = torch.randn_like(tokens)

    def step():
        for parameter in parameters:
            parameter.grad = None
        (forward(tokens) * upstream).sum().backward()

    return mean_seconds(step, tokens.device, warmups=1, steps=steps)


def time_variants(args) -> dict[str, float]:
    torch.manual_seed(0)
    device = current_device()
    layer = MoELayer(args.hidden, args.ffn, args.experts, args.top_k, args.capacity_factor).to(device)
    dense = MLP(args.hidden, args.top_k * args.ffn).to(device)
    tokens = torch.randn(args.tokens, args.hidden, device=device)
    moe_parameters = list(layer.parameters())
    return {
        "MoE layer (gather per expert)": step_seconds(lambda x: layer(x).output, moe_parameters,
                                                      tokens, args.steps),
        "every expert on every token, masked": step_seconds(
            lambda x: every_expert_masked(layer, x), moe_parameters, tokens, args.steps),
        "loop over tokens and slots": step_seconds(
            lambda x: loop_over_tokens(layer, x), moe_parameters, tokens, args.steps),
        f"dense MLP, {args.top_k} x {args.ffn} hidden units": step_seconds(
            dense, list(dense.parameters()), tokens, args.steps),
    }


# ------------------------------------------------------------------- expert parallel, per rank

def exchange_on_rank(hidden: int, ffn: int, experts: int, top_k: int,
                     capacity_factor: float | None, tokens: int) -> dict:
    """One forward and backward of the expert-parallel layer (ep = the world) on this rank's
    own tokens: its routing counts, its experts' load and the all-to-alls it ran."""
    torch.manual_seed(0)  # the same layer on every rank
    layer = MoELayer(hidden, ffn, experts, top_k, capacity_factor).to(current_device())
    parallel = ExpertParallelMoE(layer, create_expert_groups(dist.get_world_size()))
    generator = torch.Generator().manual_seed(dist.get_rank())  # each rank its own tokens
    x = torch.randn(tokens, hidden, generator=generator).to(current_device()).requires_grad_()
    result = parallel(x)
    result.output.sum().backward()
    return {"tokens_per_expert": result.routings[0].tokens_per_expert.tolist(),
            "dropped": result.routings[0].dropped,
            "load": parallel.tokens_per_local_expert,
            "sent": {call.name: call.bytes_leaving for call in parallel.all_to_all_log}}


def report_expert_parallel(args, world_size: int) -> bool:
    per_rank = launch(exchange_on_rank, world_size, args.hidden, args.ffn, args.experts,
                      args.top_k, args.capacity_factor, args.tokens, timeout=LAUNCH_TIMEOUT)
    load = [n for result in per_rank for n in result["load"]]   # experts in global order
    dropped = sum(result["dropped"] for result in per_rank)
    print(f"\nep = {world_size} ({args.experts // world_size} experts per rank), "
          f"{args.tokens} tokens per rank, {dropped} of {world_size * args.tokens * args.top_k} "
          "assignments dropped")
    print("tokens per expert:   " + " ".join(f"{n:>5}" for n in load))
    print("relative to mean:    " + " ".join(f"{r:>5.2f}" for r in relative_load(load)))
    print(f"load imbalance (max/mean): {load_imbalance(load):.2f}")
    uniform = (world_size - 1) * args.tokens * args.top_k * args.hidden * 4 // world_size
    print(f"bytes each rank sends to the others, per exchange (uniform routing, dropless: "
          f"(ep-1)/ep T k h 4 = {uniform:,})")
    print(f"{'rank':>4}  " + "  ".join(f"{name:>26}" for name in EXCHANGES) + "  verdict")
    counts = [result["tokens_per_expert"] for result in per_rank]
    all_match = True
    for rank, result in enumerate(per_rank):
        formula = all_to_all_bytes(counts, rank, args.hidden, bytes_per_element=4)
        expected = [formula.dispatch_forward, formula.combine_forward,
                    formula.dispatch_backward, formula.combine_backward]
        measured = [result["sent"][name] for name in EXCHANGES]
        match = measured == expected
        all_match &= match
        cells = [f"{m:>12,} vs {e:>11,}" for m, e in zip(measured, expected)]
        print(f"{rank:>4}  " + "  ".join(f"{cell:>26}" for cell in cells)
              + f"  {'match' if match else 'DIFFER'}")
    return all_match


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--ffn", type=int, default=512, help="each expert's hidden units")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256, help="tokens (per rank for EP)")
    parser.add_argument("--capacity-factor", type=float, default=None,
                        help="expert capacity factor (default: dropless)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args(argv)
    capacity = "dropless" if args.capacity_factor is None else f"capacity factor {args.capacity_factor}"
    print(f"MoE: hidden {args.hidden}, {args.experts} experts of {args.ffn} hidden units, "
          f"top-{args.top_k}, {capacity}; {args.tokens} tokens; fp32 on "
          f"{current_device()}, {torch.get_num_threads()} thread(s)")
    times = time_variants(args)
    baseline = next(iter(times.values()))
    print(f"\n{'forward + backward':<40}  {'ms':>8}  {'/ MoE layer':>11}")
    for name, seconds in times.items():
        print(f"{name:<40}  {1e3 * seconds:>8.2f}  {seconds / baseline:>11.2f}")
    all_match = all([report_expert_parallel(args, world_size) for world_size in args.world_sizes])
    print("\nbytes sent (measured vs formula), forward and backward, on every rank: "
          + ("match" if all_match else "SOME DIFFER"))


if __name__ == "__main__":
    main()
