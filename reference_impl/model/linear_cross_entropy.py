"""The LM head and the cross-entropy in one, chunk by chunk: no (tokens, vocab) logits kept.

:func:`linear_cross_entropy` computes the mean loss a chunk of tokens at a time and, in the same
pass, the gradients of the hidden states and of the head's weight (the gradient of a
cross-entropy with respect to its logits, softmax(z) - onehot(target), is known in the forward):
the fused linear cross-entropy of Liger Kernel (Hsu et al. 2024) and of Wijmans et al. 2024,
"Cut Your Losses in Large-Vocabulary Language Models", in plain PyTorch. Memory and numerics:
docs/library.md, 'Speed on one device'.
"""
from __future__ import annotations

import torch

DEFAULT_CHUNK_TOKENS = 2048


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets`` (docs/library.md)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens: int, dtype: torch.dtype):
        tokens, grads_wanted = hidden.shape[0], any(ctx.needs_input_grad[:2])
        w = weight.to(dtype)
        grad_hidden = grad_weight = None  # made only where a backward will read them
        if grads_wanted:
            grad_hidden = torch.empty(hidden.shape, dtype=dtype, device=hidden.device)
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, tokens, chunk_tokens):
                h = hidden[start:start + chunk_tokens].to(dtype)
                t = targets[start:start + chunk_tokens]
                logits = (h @ w.t()).float()
                lse = torch.logsumexp(logits, dim=-1)
                total += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
                if not grads_wanted:
                    continue
                probabilities = logits.sub_(lse[:, None]).exp_()  # softmax, in place
                probabilities[torch.arange(len(t), device=t.device), t] -= 1
                grad = probabilities.to(dtype)  # d (summed loss) / d logits
                grad_hidden[start:start + chunk_tokens] = grad @ w
                grad_weight += grad.t() @ h
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.tokens, ctx.dtypes = tokens, (hidden.dtype, weight.dtype)
        return total / tokens

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_loss / ctx.tokens
        return ((grad_hidden * scale).to(ctx.dtypes[0]), (grad_weight * scale).to(ctx.dtypes[1]),
                None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """``gpt_loss(hidden @ weight.T, targets)`` without the whole logits: ``hidden`` (..., h),
    ``weight`` (V, h) (the LM head's, no bias), ``targets`` (...) of word indices."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} needs targets of shape "
                         f"{tuple(hidden.shape[:-1])}, got {tuple(targets.shape)}")
    device = hidden.device.type
    dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
             else hidden.dtype)
    return LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight,
                                    targets.reshape(-1), chunk_tokens, dtype)
