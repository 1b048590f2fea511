"""Profile a TP block or lab 5's DDP on every rank, and merge and summarise the traces.

    python -m reference_impl.perf.profiling --tp 2 --steps 3 --out DIR

profiles a TP block on ``--tp`` CPU ranks (gloo; ``--backend nccl``: one GPU per rank) and
writes ``DIR/rank{r}.json``, ``DIR/merged.json`` and prints the summary. Lab 6's workloads,
each run on every rank of a launch: :func:`profile_tp_block_on_rank` and
:func:`profile_ddp_on_rank`. They are built from the named ranges
(:mod:`reference_impl.perf.ranges`), the per-rank traces (:mod:`reference_impl.perf.traces`)
and the summary (:mod:`reference_impl.perf.trace_summary`); how it all fits, and what to look
for on CPU ranks and under Nsight Systems: ``docs/profiling.md``.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

from reference_impl.comm.device import current_device, wait_for_device
from reference_impl.perf.ranges import profiled
from reference_impl.perf.trace_summary import summarize
from reference_impl.perf.traces import merge_traces, rank_trace


def profile_tp_block_on_rank(out_dir: str, steps: int = 3, hidden: int = 64, heads: int = 4,
                             seq: int = 32, batch: int = 2, enabled: bool = True) -> dict:
    """Run on every rank of a launch: ``steps`` forward + backward steps of a ``ParallelBlock``
    (after one warm-up step) under ``profiled`` and ``rank_trace``; returns the trace's
    path and the all-reduces ``CommTracer`` counted meanwhile."""
    from reference_impl.comm.comm_trace import CommTracer
    from reference_impl.model import Block, ModelConfig
    from reference_impl.tp.tp_attention import ParallelBlock

    device = current_device()
    torch.manual_seed(0)
    block = ParallelBlock(Block(ModelConfig(hidden=hidden, heads=heads, seq_len=seq)).to(device))
    x = torch.randn(batch, seq, hidden).to(device).requires_grad_()
    upstream = torch.randn(batch, seq, hidden).to(device)
    block(x).backward(upstream)  # warm-up
    with rank_trace(out_dir) as profiler, CommTracer() as tracer, \
            profiled(block, enabled=enabled):
        for _ in range(steps):
            block.zero_grad(set_to_none=True)
            block(x).backward(upstream)
        wait_for_device()
    return {"path": profiler.path, "all_reduces": tracer.count("all_reduce"),
            "collectives": tracer.summary()}


def profile_ddp_on_rank(out_dir: str, bucket_bytes: int, steps: int = 3, width: int = 512,
                        layers: int = 6, batch: int = 256, name: str = "rank{rank}.json") -> dict:
    """Run on every rank of a launch: ``steps`` training steps (after one warm-up step) of an
    MLP of ``layers`` ``Linear(width, width) + ReLU`` layers ("layer0", ...) wrapped in lab 5's
    ``OverlappingDataParallel`` with ``bucket_bytes`` per bucket, under ``profiled`` and
    ``rank_trace``. The layers' backward ranges are the compute the buckets' all-reduces
    can hide behind; their time in flight is on the "collectives in flight" row. A bucket of
    ``(width + 1) * width * 4`` bytes holds one layer (its all-reduce starts as soon as that
    layer's gradients are ready, inside the backward); one of ``2**40`` every gradient (its
    all-reduce starts at the end of the backward). Returns the trace's path and the number of
    buckets."""
    from collections import OrderedDict

    from reference_impl.hybrid.ddp_hooks import OverlappingDataParallel

    device = current_device()
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        (f"layer{i}", nn.Sequential(nn.Linear(width, width), nn.ReLU())) for i in range(layers)))
    model.to(device)
    ddp = OverlappingDataParallel(model, bucket_bytes=bucket_bytes)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1 + dist.get_rank())  # each rank its own samples
    x = torch.randn(batch, width, generator=generator).to(device).requires_grad_()  # so that
    target = torch.randn(batch, width, generator=generator).to(device)  # layer0's backward
    #                                                        range closes after it

    def step():
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), target).backward()
        ddp.finish_gradient_sync()
        optimizer.step()

    step()  # warm-up
    with rank_trace(out_dir, name=name) as profiler, profiled(model):
        for _ in range(steps):
            step()
        wait_for_device()
    ddp.remove_hooks()
    return {"path": profiler.path, "buckets": len(ddp.buckets)}


def main(argv: list[str] | None = None) -> None:
    from reference_impl.comm.launcher import launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="profile")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--backend", default="gloo", choices=("auto", "gloo", "nccl"))
    args = parser.parse_args(argv)

    out_dir = os.path.abspath(args.out)
    results = launch(profile_tp_block_on_rank, args.tp, out_dir, args.steps, args.hidden,
                     args.heads, args.seq, args.batch, backend=args.backend, timeout=300.0)
    paths = [result["path"] for result in results]
    merged_path = os.path.join(out_dir, "merged.json")
    merge_traces(paths, merged_path)
    print(f"TP block on {args.tp} ranks, hidden {args.hidden}, heads {args.heads}, seq "
          f"{args.seq}, batch {args.batch}; {args.steps} profiled steps")
    for rank, path in enumerate(paths):
        print(f"rank {rank}: {path} ({results[rank]['all_reduces']} all-reduces by CommTracer)")
    print(f"merged: {merged_path}  (open in https://ui.perfetto.dev or chrome://tracing)\n")
    print(summarize(merged_path))


if __name__ == "__main__":
    main()
