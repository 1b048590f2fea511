"""The LM head and the loss in one pass (``linear_cross_entropy.py``) against
``gpt_loss(hidden @ weight.T, targets)``: the loss, the hidden states' and the weight's
gradients, for chunks that divide the tokens and chunks that do not, a scaled incoming
gradient, large logits, and bf16 autocast. fp32 tolerances: rtol 1e-5 on the loss, atol 1e-6
on the gradients (elements of order 1e-2); bf16: the same loss as autocast's path to 2e-2
relative (both round the logits' inputs to bf16)."""
import pytest
import torch

from reference_impl.model.linear_cross_entropy import linear_cross_entropy
from reference_impl.pipeline.gpt_stages import gpt_loss


def case(scale=1.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(3, 10, 16, generator=generator) * scale).requires_grad_()
    weight = torch.randn(50, 16, generator=generator).requires_grad_()
    return hidden, weight, torch.randint(50, (3, 10), generator=generator)


def gradients(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("chunk", [1, 7, 30, 64], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("scale", [1.0, 30.0], ids=["randn", "large logits"])
def test_matches_the_head_then_the_loss(chunk, scale):
    hidden, weight, targets = case(scale)
    expected = gpt_loss(hidden @ weight.t(), targets)
    got = linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for g, e in zip(gradients(3 * got, hidden, weight), gradients(3 * expected, hidden, weight)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6 * scale)


def test_bf16_autocast_rounds_as_the_head_would():
    hidden, weight, targets = case()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = gpt_loss(hidden @ weight.t(), targets)
        got = linear_cross_entropy(hidden, weight, targets, chunk_tokens=8)
    torch.testing.assert_close(got, expected.float(), rtol=2e-2, atol=0)
    grad_hidden, grad_weight = gradients(got, hidden, weight)
    assert grad_hidden.dtype == hidden.dtype and grad_weight.dtype == weight.dtype


def test_without_gradients_only_the_loss():
    hidden, weight, targets = case()
    with torch.no_grad():
        got = linear_cross_entropy(hidden, weight, targets)
    torch.testing.assert_close(got, gpt_loss(hidden @ weight.t(), targets).detach())


def test_bad_input_is_named():
    hidden, weight, targets = case()
    with pytest.raises(ValueError, match="chunk_tokens must be at least 1, got 0"):
        linear_cross_entropy(hidden, weight, targets, chunk_tokens=0)
    with pytest.raises(ValueError, match=r"targets of shape \(3, 10\), got \(3, 9\)"):
        linear_cross_entropy(hidden, weight, targets[:, :9])
