"""bf16 parameters with fp32 master weights: Megatron-LM's ``--bf16`` step on one device.

Autocast (:mod:`reference_impl.model.precision`) keeps fp32 parameters, casts every matmul weight to
bf16 at each forward and keeps the residual stream and the norms in fp32: on an H100 that
memory traffic is about a third of a 1.4B GPT's step (docs/profiling.md). Here the model itself
is bf16, so a step casts nothing: activations, residual stream and weights are bf16. What
accumulates stays fp32: each gradient is added into an fp32 ``main_grad`` as soon as autograd
has it (a post-accumulate-grad hook, so micro-batches accumulate in fp32, as Megatron-LM's
``main_grad`` buffers do), and the optimizer updates fp32 masters, whose bf16 rounding becomes
the parameter. Bytes per parameter: 2 (bf16 weight) + 4 (fp32 gradient) + 12 (fp32 master, m,
v) = 18 with Adam, as with autocast.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class MasterWeights:
    """``model``'s parameters made bf16, an optimizer over their fp32 masters.

    ``build(masters)`` returns the optimizer of the fp32 masters (``torch.optim.AdamW(masters,
    ...)``); ``zero_grad()`` and ``step()`` stand in for the optimizer's. The gradients to clip
    or log are ``main_grads``."""

    def __init__(self, model: nn.Module, build: Callable[[list[torch.Tensor]], torch.optim.Optimizer]):
        self.params = [p for p in model.parameters() if p.requires_grad]
        if any(p.dtype != torch.float32 for p in self.params):
            raise ValueError("MasterWeights takes an fp32 model (its masters are those weights); "
                             f"found {sorted({str(p.dtype) for p in self.params})}")
        self.masters = [p.detach().clone() for p in self.params]
        self.main_grads = [torch.zeros_like(m) for m in self.masters]
        for master, grad in zip(self.masters, self.main_grads):
            master.grad = grad
        model.to(torch.bfloat16)
        for param, grad in zip(self.params, self.main_grads):
            param.register_post_accumulate_grad_hook(self._accumulate_into(grad))
        self.optimizer = build(self.masters)

    @staticmethod
    def _accumulate_into(main_grad: torch.Tensor):
        def accumulate(param: torch.Tensor) -> None:
            main_grad.add_(param.grad)
            param.grad = None  # the bf16 gradient is not kept: fp32 holds the sum
        return accumulate

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the fp32 gradients in place: their buffers stay, as Megatron's do (the
        argument is the optimizer's; the bf16 gradients are never kept)."""
        torch._foreach_zero_(self.main_grads)

    @torch.no_grad()
    def step(self) -> None:
        self.optimizer.step()
        torch._foreach_copy_(self.params, self.masters)  # one launch for every bf16 rounding
