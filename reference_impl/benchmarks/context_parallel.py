"""Context-parallel attention: ring vs all-gather vs one device, bytes sent, overlap.

    python -m reference_impl.benchmarks.context_parallel [--batch 2 --heads 8 --kv-heads 2
        --seq 512 --hidden 256 --cp 2 4 --repeats 3 --threads 1 --backend auto]

For each cp, one attention layer (``cp/cp_attention.py``) on cp ranks: time per layer of ring
attention, the all-gather variant and one device; bytes sent per rank against ``cp_costs``; the
share of each ring step's transfer hidden behind compute; PyTorch's own ``context_parallel``
beside it where it runs. Times are printed, never asserted. What each column is, and the
machine's caveats: docs/library.md, 'Beyond the three dimensions'.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.cp.cp_attention import ContextParallelAttention
from reference_impl.model.llama_blocks import GroupedQueryAttention
from reference_impl.cp.cp_costs import allgather_attention_bytes, ring_attention_bytes
from reference_impl.cp.load_balance import shard_sequence
from reference_impl.cp.ring_overlap import RingClock
from reference_impl.model import repeat_kv_heads
from reference_impl.perf.step_timing import mean_seconds, median_step_seconds

CP_DEGREES = (2, 4)
LAUNCH_TIMEOUT = 300.0
VARIANTS = {"ring": ring_attention_bytes, "allgather": allgather_attention_bytes}


def _sent_bytes(trace: CommTracer, cp: int) -> int:
    collectives = trace.total_bytes("all_gather") + trace.total_bytes("reduce_scatter")
    return trace.total_bytes("isend") + collectives * (cp - 1) // cp


def _torch_context_parallel(q, k, v, reference, repeats) -> dict:
    """PyTorch's CP attention on the whole sequence's q, k, v (it shards them itself, head-tail
    load-balanced): seconds per forward + backward and the largest difference of this rank's
    output from ``reference`` (this rank's share of the single-device output, our layout), or
    why it cannot run."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        mesh = init_device_mesh(current_device().type, (dist.get_world_size(),))
        k, v = repeat_kv_heads(k, q.shape[1]), repeat_kv_heads(v, q.shape[1])  # SDPA's heads
        buffers = [t.detach().clone() for t in (q, k, v)]
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2],
                              no_restore_buffers=set(buffers)):
            leaves = [t.clone().requires_grad_() for t in buffers]  # this rank's shards now

            def step():
                out = F.scaled_dot_product_attention(*leaves, is_causal=True)
                out.backward(torch.ones_like(out))
                return out

            difference = (step().detach() - reference).abs().max().item()
            seconds = mean_seconds(step, current_device(), warmups=0, steps=repeats)
        return {"seconds": seconds, "difference": difference}
    except Exception as error:  # noqa: BLE001 - any failure is reported, not raised
        first_line = (str(error).strip().splitlines() or [""])[0]
        return {"skipped": f"{type(error).__name__}: {first_line[:150]}"}


def measure_on_rank(batch: int, seq: int, hidden: int, heads: int, kv_heads: int,
                    repeats: int) -> dict:
    """Run on every rank: time the CP layers and the single-device layer, trace the bytes,
    time the ring's steps, and try PyTorch's CP."""
    cp, rank, device = dist.get_world_size(), dist.get_rank(), current_device()
    torch.manual_seed(0)
    single = GroupedQueryAttention(hidden, heads, kv_heads, bias=True).to(device)
    layers = {variant: ContextParallelAttention(single, None, variant) for variant in VARIANTS}
    generator = torch.Generator().manual_seed(1)
    x, upstream = (torch.randn(batch, seq, hidden, generator=generator).to(device) for _ in range(2))
    x_local = shard_sequence(x, cp, rank).requires_grad_()
    times = median_step_seconds(layers, x_local, shard_sequence(upstream, cp, rank), repeats)

    dist.barrier()
    if rank == 0:  # the single device alone, the other ranks waiting
        whole = x.clone().requires_grad_()
        times["single"] = mean_seconds(lambda: single(whole).backward(upstream), device,
                                       warmups=1, steps=repeats)
    dist.barrier()

    sent = {}
    with torch.no_grad():
        q, k, v = layers["ring"].project(x_local, layers["ring"].positions(x_local))
    for variant, layer in layers.items():  # the attention core's traffic, forward and backward
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with CommTracer() as forward:
            out = layer.core(*leaves)
        with CommTracer() as backward:
            out.backward(torch.ones_like(out))
        sent[variant] = (_sent_bytes(forward, cp), _sent_bytes(backward, cp))

    clock = RingClock()
    with torch.no_grad():
        layers["ring"](x_local, clock)
    shares = clock.hidden_shares()

    with torch.no_grad():
        q, k, v = single.project(x, torch.arange(seq, device=device))
        reference = F.scaled_dot_product_attention(q, repeat_kv_heads(k, heads),
                                                   repeat_kv_heads(v, heads), is_causal=True)
    torch_cp = _torch_context_parallel(q, k, v, shard_sequence(reference, cp, rank, dim=2), repeats)
    return {"times": times, "sent": sent, "shares": shares, "torch_cp": torch_cp}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--cp", type=int, nargs="+", default=list(CP_DEGREES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    args = parser.parse_args(argv)
    head_dim = args.hidden // args.heads
    print(f"attention layer: batch {args.batch}, seq {args.seq}, hidden {args.hidden}, heads "
          f"{args.heads}, kv_heads {args.kv_heads} (head_dim {head_dim}), fp32; "
          f"os.cpu_count() = {os.cpu_count()}, {args.threads} thread(s) per rank")
    results = {cp: launch(measure_on_rank, cp, args.batch, args.seq, args.hidden, args.heads,
                          args.kv_heads, args.repeats, backend=args.backend, threads=args.threads,
                          timeout=LAUNCH_TIMEOUT)
               for cp in args.cp}

    print(f"\ntime per layer, forward + backward (ms; median of {args.repeats}, slowest rank)")
    print(f"{'cp':>3}  {'single':>8}  {'ring':>8}  {'allgather':>9}  {'ring/single':>11}  "
          f"{'allgather/single':>16}  {'ring/allgather':>14}")
    for cp, per_rank in results.items():
        times = {name: 1e3 * seconds for name, seconds in per_rank[0]["times"].items()}
        single, ring, gathered = times["single"], times["ring"], times["allgather"]
        print(f"{cp:>3}  {single:>8.2f}  {ring:>8.2f}  {gathered:>9.2f}  {ring / single:>11.2f}  "
              f"{gathered / single:>16.2f}  {ring / gathered:>14.2f}")

    print("\nbytes sent per rank by the attention core: measured (CommTracer) and cp_costs' formula")
    print(f"{'cp':>3}  {'variant':>9}  {'forward':>9}  {'formula':>9}  {'backward':>9}  "
          f"{'formula':>9}  verdict")
    for cp, per_rank in results.items():
        for variant, formula_of in VARIANTS.items():
            formula = formula_of(args.batch, args.kv_heads, args.seq, head_dim, cp)
            measured = {result["sent"][variant] for result in per_rank}
            forward, backward = per_rank[0]["sent"][variant]
            match = measured == {(formula["forward"], formula["backward"])}
            print(f"{cp:>3}  {variant:>9}  {forward:>9}  {formula['forward']:>9}  {backward:>9}  "
                  f"{formula['backward']:>9}  {'match' if match else 'DIFFER'}")

    print("\nshare of each forward ring step's K/V transfer hidden behind its compute, C / (C + wait)")
    print(f"{'cp':>3}  {'mean over ranks':>15}  rank 0, per step")
    for cp, per_rank in results.items():
        shares = [share for result in per_rank for share in result["shares"]]
        if not shares:
            print(f"{cp:>3}  {'-':>15}  no transfer at cp = 1")
            continue
        steps = " ".join(f"{share:.2f}" for share in per_rank[0]["shares"])
        print(f"{cp:>3}  {sum(shares) / len(shares):>15.2f}  {steps}")

    print("\nPyTorch's context_parallel (the attention core, SDPA over a device mesh) beside ours")
    for cp, per_rank in results.items():
        torch_cp = per_rank[0]["torch_cp"]
        if "skipped" in torch_cp:
            print(f"{cp:>3}  skipped: {torch_cp['skipped']}")
        else:
            print(f"{cp:>3}  {1e3 * torch_cp['seconds']:.2f} ms per forward + backward, max |diff| "
                  f"from one device {torch_cp['difference']:.2e}")


if __name__ == "__main__":
    main()
