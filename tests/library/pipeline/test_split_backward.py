"""The zero-bubble split of the backward: B (input gradient) + W (weight gradients) is one
backward, matmul for matmul, and gives the same gradients."""
import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reference_impl.checks import assert_close
from reference_impl.model import GPT, ModelConfig
from reference_impl.pipeline.gpt_stages import Stage
from reference_impl.pipeline.pipeline_partition import gpt_layers
from reference_impl.pipeline.split_backward import DeferredWeightGrads, weight_grads_deferred

MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


class MatmulCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS:
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def two_block_stage():
    torch.manual_seed(0)
    gpt = GPT(ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=2))
    return Stage(*gpt_layers(gpt)[1:3])  # the two blocks: 8 linear layers, 2 attentions


def count(function):
    counter = MatmulCounter()
    with counter:
        function()
    return counter.counts


def test_b_plus_w_is_one_backward_to_the_matmul():
    whole, split = two_block_stage(), two_block_stage()
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))

    x_whole = x.clone().requires_grad_()
    y_whole = whole(x_whole)
    backward = count(lambda: y_whole.backward(upstream))

    x_split = x.clone().requires_grad_()
    store = DeferredWeightGrads()
    with weight_grads_deferred(split, store):
        y_split = split(x_split)
    b = count(lambda: y_split.backward(upstream))
    assert all(p.grad is None for n, p in split.named_parameters() if "weight" in n and
               p.dim() == 2), "B computed a linear layer's weight gradient"
    w = count(store.flush)

    # 8 linear layers: B has their 8 input-gradient matmuls and attention's 8 batched ones,
    # W their 8 weight-gradient matmuls; the whole backward has all 24.
    assert b == {"mm": 8, "bmm": 8}, b
    assert w == {"mm": 8}, w
    assert {k: b.get(k, 0) + w.get(k, 0) for k in backward} == backward, (b, w, backward)

    assert_close(x_split.grad, x_whole.grad, "input gradient after B", atol=1e-6)
    for (name, p_split), p_whole in zip(split.named_parameters(), whole.parameters()):
        assert_close(p_split.grad, p_whole.grad, f"gradient of {name} after W", atol=1e-6)


def test_the_graph_is_freed_by_b():
    stage = two_block_stage()
    x = torch.randn(2, 8, 16).requires_grad_()
    store = DeferredWeightGrads()
    with weight_grads_deferred(stage, store):
        y = stage(x)
    y.backward(torch.ones_like(y))
    assert len(store.pending) == 8
    try:
        y.backward(torch.ones_like(y))
    except RuntimeError as error:
        assert "second time" in str(error)
    else:
        raise AssertionError("B kept the graph alive until W")


def test_linear_layers_are_restored_after_the_split():
    stage = two_block_stage()
    reference = copy.deepcopy(stage)
    with weight_grads_deferred(stage, DeferredWeightGrads()):
        pass
    x = torch.randn(2, 8, 16)
    assert_close(stage(x), reference(x), "output after leaving the split", atol=0)
    assert all("forward" not in vars(m) for m in stage.modules())
