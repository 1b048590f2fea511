"""Mixed precision: bf16 compute, fp32 for everything that accumulates.

The kit trains in one of two precisions (``precision=`` in the library, ``--dtype`` on the
command line; fp32 is the default, and what the graded tests compare with allclose):

    precision  matmuls, attention   parameters         gradients   Adam m, v   DP reduction
    "fp32"     fp32                 fp32               fp32        fp32        fp32
    "bf16"     bf16 (autocast)      fp32 (the master)  fp32        fp32        fp32

**How.** ``torch.autocast(device, dtype=torch.bfloat16)`` around each forward pass and its loss
(:func:`autocast`; never around the backward or the optimizer step, as PyTorch's "Automatic
Mixed Precision" documentation asks). Inside it a matmul (``linear``, ``matmul``,
``scaled_dot_product_attention``) casts its inputs to bf16 and runs in bf16 with fp32
accumulation; the weights stay fp32 parameters, and the cast's backward turns each weight's
gradient back into fp32. So gradients accumulate over micro-batches in fp32, are reduced in
fp32 (``data_parallel.sync_gradients``' all-reduce, ZeRO's reduce-scatter), and Adam updates
the fp32 weights, which are the master copy, from fp32 m and v. What leaves a matmul is bf16:
the TP collectives of the forward (the row-parallel all-reduce, SP's reduce-scatter) move bf16,
as Megatron-LM's do. Layernorm, softmax (``attention.causal_attention``) and the loss run in fp32,
and the residual stream stays fp32 (x + a bf16 branch is fp32), so pipeline stages exchange
fp32 activations.

**Why this design.** Megatron-LM (``--bf16``) keeps bf16 parameters for the compute, adds every
gradient into an fp32 ``main_grad`` buffer, reduces that in fp32 and keeps fp32 master weights
in its optimizer; PyTorch's FSDP does the same with ``MixedPrecision(param_dtype=bf16,
reduce_dtype=fp32)``. Autocast reaches the same numbers with no change to any layer: every
parallel path (TP, SP, PP, DP, ZeRO, 3D) runs in bf16 by entering one context, and the bytes
per parameter are the same, 18 with Adam: here 4 (fp32 weight) + 4 (fp32 gradient) + 8 (m, v)
+ 2 (the bf16 copy autocast makes of each matmul weight, kept from its forward to its
backward: :func:`weight_copy_bytes`); Megatron's 2 (bf16 weight) + 4 (fp32 main_grad) + 12
(fp32 master, m, v). The costs: the weights are cast again at every forward (in a pipeline,
each micro-batch in flight holds its own bf16 copy of its stage's weights), ZeRO-3 all-gathers
fp32 weights (FSDP gathers bf16), and the residual stream takes 4 bytes an element, not 2.

**Why fp32 gradients.** bf16 keeps 8 significant bits: adding a small gradient to a large sum
(micro-batch accumulation, the ring all-reduce's partial sums over many ranks) loses its low
bits, and a sum over N ranks in bf16 is off by up to about N * 2^-9 relative. bf16 and not fp16:
bf16 has fp32's exponent range, so no loss scaling is needed.

**Tolerances.** One bf16 rounding has a relative error of up to 2^-9 (about 2e-3); a result
that went through a few of them differs between two correct computations (single device and
TP, say: a row-parallel layer rounds each rank's partial sum, then the sum) by about 1e-2 of
its scale. The bf16 tests (``tests/library/hybrid/test_bf16.py``) compare each parallel path with the
*single-device model in bf16*, never with fp32 (bf16 against fp32 differs by as much as two
correct bf16 runs do), with tolerances stated there in units of each tensor's largest element.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from reference_impl.comm.device import current_device

PRECISIONS = ("fp32", "bf16")
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def check_precision(precision: str) -> str:
    """``precision`` if it names one, else a ValueError naming the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, "
                         f"got {precision!r}")
    return precision


def autocast(precision: str, device: torch.device | str | None = None):
    """The context a forward pass and its loss run in: bf16 autocast on ``device``'s type
    (default: this rank's ``current_device()``), or nothing for fp32."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    if device is None:
        device = current_device()
    return torch.autocast(torch.device(device).type, dtype=COMPUTE_DTYPES[precision])


class Autocast(nn.Module):
    """``module`` with its forward under :func:`autocast` (for code that calls a module and
    runs its backward itself, such as a step timer); the parameters are ``module``'s."""

    def __init__(self, module: nn.Module, precision: str):
        super().__init__()
        self.module, self.precision = module, check_precision(precision)

    def forward(self, *args, **kwargs):
        with autocast(self.precision):
            return self.module(*args, **kwargs)


def weight_copy_bytes(module: nn.Module, precision: str) -> int:
    """Bytes of the bf16 copies autocast makes of ``module``'s matmul weights (every
    ``nn.Linear`` weight; biases are added, not multiplied, and not kept for the backward),
    held from each forward to its backward. 0 in fp32."""
    if check_precision(precision) == "fp32":
        return 0
    size = torch.finfo(COMPUTE_DTYPES[precision]).bits // 8
    return sum(layer.weight.numel() * size for layer in module.modules()
               if isinstance(layer, nn.Linear))
