"""The backward split in two, as zero-bubble pipelines need it (Qi et al., "Zero Bubble
Pipeline Parallelism", 2023): B computes only the input gradient, W the weight gradients.

Each ``nn.Linear`` runs through :class:`_SplitLinear`: B computes dx = dy W and defers
dW = dy^T x to :class:`DeferredWeightGrads`, whose ``flush()`` runs it later, so B + W is one
backward, matmul for matmul, at the price of keeping (x, dy) until W. Other modules take part by
defining ``forward_deferring_weight_grads(*inputs, store)``. Details: docs/library.md,
'Validating, simulating, splitting the backward'.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class DeferredWeightGrads:
    """The weight-gradient computations of one stage for one microbatch, deferred to W."""

    def __init__(self):
        self.pending: list[Callable[[], None]] = []

    def defer(self, compute: Callable[[], None]) -> None:
        """Called during B: ``compute()`` adds some weight gradients into ``.grad`` at W."""
        self.pending.append(compute)

    def flush(self) -> None:
        """W: every deferred computation; then forget them. Last deferred first: B ended on
        the stage's first layers, whose tensors are still in cache."""
        for compute in reversed(self.pending):
            compute()
        self.pending.clear()


def _linear_weight_grads(linear: nn.Linear, x: torch.Tensor, dy: torch.Tensor) -> None:
    """dW = dy^T x and db = sum dy over the tokens, added into ``.grad`` (one matmul, in the
    forward's precision)."""
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    weight, bias = linear.weight, linear.bias
    if weight.requires_grad:
        _accumulate(weight, dy2.t(), x2)
    if bias is not None and bias.requires_grad:
        _accumulate(bias, dy2.sum(0))


def _accumulate(parameter: nn.Parameter, a: torch.Tensor, b: torch.Tensor | None = None):
    """``parameter.grad += a @ b`` (or ``+= a``), in the parameter's dtype: in place with one
    addmm when the dtypes agree; a bf16 product is cast to the fp32 gradient first, as autograd
    does for a weight that autocast cast (``precision.py``)."""
    grad = parameter.grad
    if b is not None and grad is not None and a.dtype == grad.dtype:
        grad.addmm_(a, b)
        return
    value = (a if b is None else a @ b).to(parameter.dtype)
    parameter.grad = value if grad is None else grad.add_(value)


class _SplitLinear(torch.autograd.Function):
    """F.linear whose backward returns the input's gradient only and defers the weights'.
    Under bf16 autocast the forward's matmul runs in bf16: like autograd, keep the input in
    the dtype the matmul read it in, and compute B and W in that dtype."""

    @staticmethod
    def forward(ctx, x, weight, bias, linear, store):
        y = F.linear(x, weight, bias)
        ctx.save_for_backward(x.to(y.dtype), weight)
        ctx.linear, ctx.store = linear, store
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        ctx.store.defer(functools.partial(_linear_weight_grads, ctx.linear, x.detach(),
                                          dy.detach()))
        dx = dy @ weight.to(dy.dtype) if ctx.needs_input_grad[0] else None
        return dx, None, None, None, None


@contextlib.contextmanager
def weight_grads_deferred(stage: nn.Module, store: DeferredWeightGrads):
    """Inside: every ``nn.Linear`` of ``stage`` (and every module that defines
    ``forward_deferring_weight_grads``) defers its weight gradients to ``store``.
    Enter it around the forward (and around a backward that recomputes the forward)."""
    patched = []
    for module in stage.modules():
        forward = _deferring_forward(module, store)
        if forward is not None:
            module.forward = forward
            patched.append(module)
    try:
        yield store
    finally:
        for module in patched:
            del module.forward  # back to the class's forward


def _deferring_forward(module: nn.Module, store: DeferredWeightGrads):
    if type(module) is nn.Linear:
        return lambda x: _SplitLinear.apply(x, module.weight, module.bias, module, store)
    custom = getattr(module, "forward_deferring_weight_grads", None)
    return None if custom is None else functools.partial(custom, store=store)
