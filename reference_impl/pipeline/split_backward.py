"""The backward split in two, as zero-bubble pipelines need it (Qi et al., "Zero Bubble
Pipeline Parallelism", 2023): B computes only the input gradient, W the weight gradients.

A linear layer y = x W^T + b has two matmuls in its backward:

    dx = dy W        (B: the next stage down the pipeline is waiting for it)
    dW = dy^T x      (W: nobody waits for it; it can fill a bubble later)

While the weight gradients are deferred, every linear layer of the stage runs through
:class:`_SplitLinear`, whose backward computes dx only and stores (x, dy) in a
:class:`DeferredWeightGrads`; ``flush()`` later computes each dW = dy^T x (and db = sum dy)
and adds it into the parameter's ``.grad``. B walks the graph once and frees it; W walks no
graph at all, so B + W costs exactly one backward, matmul for matmul. Memory is the price: x
and dy of every linear stay alive from B until W (the in-flight activations of a ZB-H1 rank
are held until W, not until B).

Only ``nn.Linear`` layers are split (every matmul with weights in the course's GPT); other
parameters (layernorms, embeddings) get their small gradients during B.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


class DeferredWeightGrads:
    """The (input, output gradient) pairs of one stage's linear layers, for one microbatch."""

    def __init__(self):
        self.pending: list[tuple[nn.Linear, torch.Tensor, torch.Tensor]] = []

    def flush(self) -> None:
        """W: every deferred weight gradient, accumulated into ``.grad``; then forget them.
        Last stored first: B ended on the stage's first layers, whose tensors are still in cache."""
        for linear, x, dy in reversed(self.pending):
            x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
            weight, bias = linear.weight, linear.bias
            if weight.requires_grad:  # dW = dy^T x (one matmul, in the forward's precision)
                _accumulate(weight, dy2.t(), x2)
            if bias is not None and bias.requires_grad:
                _accumulate(bias, dy2.sum(0))
        self.pending.clear()


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
        ctx.store.pending.append((ctx.linear, x.detach(), dy.detach()))
        dx = dy @ weight.to(dy.dtype) if ctx.needs_input_grad[0] else None
        return dx, None, None, None, None


@contextlib.contextmanager
def weight_grads_deferred(stage: nn.Module, store: DeferredWeightGrads):
    """Inside: every ``nn.Linear`` of ``stage`` defers its weight gradients to ``store``.
    Enter it around the forward (and around a backward that recomputes the forward)."""
    linears = [module for module in stage.modules() if type(module) is nn.Linear]
    for linear in linears:
        linear.forward = _split_forward(linear, store)
    try:
        yield store
    finally:
        for linear in linears:
            del linear.forward  # back to nn.Linear.forward


def _split_forward(linear: nn.Linear, store: DeferredWeightGrads):
    def forward(x):
        return _SplitLinear.apply(x, linear.weight, linear.bias, linear, store)
    return forward
