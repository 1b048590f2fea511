"""Activation memory per transformer block, measured, against this model's formula and the paper's.

    python -m reference_impl.benchmarks.activation_memory [--skip-tp]

One forward of a ``model.Block`` (then the TP and SP blocks on two gloo ranks) with no,
selective and full recomputation: the bytes autograd saves (``SavedActivations``) beside this
model's exact count (equal to the byte) and Korthikanti et al. 2022, Table 2, sbh (34 + 5as/h).
Why the two differ: docs/library.md, 'Activation memory, term by term'.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.model import Block, ModelConfig
from reference_impl.memory.activation_memory import model_activation_bytes, saved_activation_bytes
from reference_impl.memory.recompute import MODES, recompute
from reference_impl.perf.capacity import activation_bytes_with_recompute
from reference_impl.tp.sequence_parallel import SequenceParallelBlock
from reference_impl.tp.tp_attention import ParallelBlock

SHAPES = [(128, 4, 256, 8), (512, 1, 256, 8), (1024, 1, 512, 16)]  # (s, b, h, a)
TP = 2
HEADER = (f"{'s':>5} {'b':>2} {'h':>4} {'a':>3}  {'recompute':<9} {'measured B':>11} "
          f"{'this model':>11} {'paper B':>11}  {'meas/paper':>10}")


def _block_and_input(s, b, h, a, device="cpu"):
    torch.manual_seed(0)  # on the CPU, then moved: the same values on every device
    block = Block(ModelConfig(seq_len=s, hidden=h, heads=a))
    return block.to(device), torch.randn(b, s, h).to(device).requires_grad_()


def _name(mode) -> str:
    return mode or "none"


def _row(s, b, h, a, mode, measured, derived, paper) -> str:
    mark = "" if measured == derived else "  <-- differs from the formula"
    return (f"{s:>5} {b:>2} {h:>4} {a:>3}  {_name(mode):<9} {measured:>11,} {derived:>11,} "
            f"{paper:>11,.0f}  {measured / paper:>10.2f}{mark}")


def single_device() -> None:
    print("One block on one device (fp32, no dropout), bytes saved for the backward:")
    print(HEADER)
    for s, b, h, a in SHAPES:
        block, x = _block_and_input(s, b, h, a)
        for mode in MODES:
            measured = saved_activation_bytes(recompute(block, mode), x)
            print(_row(s, b, h, a, mode, measured, model_activation_bytes(s, b, h, a,
                                                                           recompute=mode),
                       activation_bytes_with_recompute(s, b, h, a, recompute=mode)))


def _parallel_rank(shapes, t):
    rows = []
    for s, b, h, a in shapes:
        block, x = _block_and_input(s, b, h, a, current_device())
        shard = x.detach().chunk(t, dim=1)[dist.get_rank()].clone().requires_grad_()
        for kind, build, inputs in (("tp", ParallelBlock, x), ("sp", SequenceParallelBlock,
                                                               shard)):
            for mode in MODES:
                measured = saved_activation_bytes(recompute(build(block), mode), inputs)
                rows.append((kind, (s, b, h, a), mode, measured))
    return rows


def tensor_parallel(t: int = TP) -> None:
    shapes = SHAPES[:2]
    results = launch(_parallel_rank, t, shapes, t)
    for kind, title in (("tp", f"TP block, t = {t}"),
                        ("sp", f"TP + SP block, t = {t} (the input a 1/t sequence shard)")):
        print(f"\n{title}, per rank (rank 0; every rank measured the same: "
              f"{all(r == results[0] for r in results)}):")
        print(HEADER)
        for row_kind, (s, b, h, a), mode, measured in results[0]:
            if row_kind != kind:
                continue
            sp = kind == "sp"
            print(_row(s, b, h, a, mode, measured,
                       model_activation_bytes(s, b, h, a, t, sp, mode),
                       activation_bytes_with_recompute(s, b, h, a, t, sp, mode)))
    print("\n  SP here keeps each column-parallel linear's *gathered* input (2 x 4sbh per rank),"
          "\n  where Megatron-LM keeps the shard and all-gathers it again in the backward: the"
          "\n  paper's sbh/t (34 + 5as/h) assumes the latter.")


def legend() -> None:
    print("""
Columns: 'measured B' = saved-tensor hooks (each storage once, parameters excluded);
'this model' = recompute.model_activation_bytes, exact for fp32 and no dropout:
    none       4 (4sbh + 12sbh/t + as^2b/t) + 16sb + s^2
    selective  4 (4sbh + 12sbh/t) + 16sb          (attention core recomputed)
    full       4 sbh                              (block input only)
    (SP: 4 (2sbh/t + 2sbh + 12sbh/t + as^2b/t) + 16sb/t + s^2)
'paper B' = Korthikanti et al. 2022, Table 2 (16-bit activations, 1-byte dropout masks):
    sbh (34 + 5as/h);  TP: sbh (10 + 24/t + 5as/(ht));  TP+SP: sbh/t (34 + 5as/h);
    selective: without the 5as/h term;  full: 2sbh (with SP the 1/t shard, 2sbh/t).
Mapping: 34 sbh = 16 activations x 2 B + 2 dropout masks x 1 B; here 16 x 4 B, no masks.
5as^2b = softmax out (2) + dropout mask (1) + dropout out (2); here the softmax out (4 B) only.
Not in the paper: layernorm mean and 1/std (16sb) and the bool causal mask (s^2).""")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-tp", action="store_true", help="skip the 2-rank TP/SP part")
    args = parser.parse_args(argv)
    single_device()
    if not args.skip_tp:
        tensor_parallel()
    legend()


if __name__ == "__main__":
    main()
