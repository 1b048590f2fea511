# Student file for the labs, generated from reference_impl/cp/online_softmax.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Attention one block of keys at a time, and the rule that merges the blocks' results.

A block of keys gives each query row a partial result, ``out`` (the softmax over the block's
keys applied to their values) and ``lse`` (the log-sum-exp of the row's scores over them). Two
partial results of the same rows merge exactly into the result over both blocks' keys, the
online softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; Dao et
al. 2022, "FlashAttention"), whose rule the notebook has you derive; it holds for scores far
beyond what exp can represent in fp32. A row that sees no key is (out, lse) = (0, -inf), never
NaN. The backward recomputes a block's
probabilities from the row's final lse (FlashAttention's recomputation), with grouped-query
K/V heads expanded inside and their gradients summed back.

The derivation: lab 8's notebook, "2. Attention block by block: the online softmax"; the
dtypes: ``docs/library.md``, "Beyond the three dimensions" (context parallelism).
"""
from __future__ import annotations

import math

import torch

from reference_impl.model import repeat_kv_heads


def visible_keys(q_positions: torch.Tensor | None,
                 k_positions: torch.Tensor | None) -> torch.Tensor | None:
    """(s_q, s_k) booleans: True where query i may attend to key j (k_pos <= q_pos, the causal
    rule written with global positions, whatever order the tokens are held in); None for a
    full (unmasked) block, when no positions are given."""
    if q_positions is None and k_positions is None:
        return None
    if q_positions is None or k_positions is None:
        raise ValueError("a causal block needs both the query and the key positions")
    return k_positions[None, :] <= q_positions[:, None]


def _scores(q, k, visible):
    """fp32 scores q k^T / sqrt(d), -inf where a key is not visible; k already expanded."""
    scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
    return scores if visible is None else scores.masked_fill(~visible, float("-inf"))


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` with -inf (rows that see no key) replaced by 0: exp(-inf - 0) is then 0, not the
    NaN of exp(-inf - (-inf))."""
    return lse.masked_fill(lse == float("-inf"), 0.0)


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    q_positions: torch.Tensor | None = None,
                    k_positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of queries q (batch, heads, s_q, d) against one block of keys and values
    (batch, kv_heads, s_k, d): causal by the global positions when given, else full.
    ``out`` is fp32 (batch, heads, s_q, d), ``lse`` fp32 (batch, heads, s_q)."""
    heads = q.shape[1]
    k, v = repeat_kv_heads(k, heads), repeat_kv_heads(v, heads)
    scores = _scores(q, k, visible_keys(q_positions, k_positions))
    lse = scores.logsumexp(dim=-1)
    probabilities = (scores - _finite(lse)[..., None]).exp()
    return (probabilities.to(v.dtype) @ v).float(), lse


def merge_partials(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor,
                   lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The online-softmax merge of two blocks' (out, lse) for the same queries (fp32): ``out``
    (batch, heads, s_q, d), ``lse`` (batch, heads, s_q); a row that sees no key of both stays
    (0, -inf)."""
    raise NotImplementedError('lab8: merge_partials (hint: "merging two blocks" in the notebook)')
    return out, lse


def output_dot_grad(out: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """D = rowsum(dO * O) (fp32, (batch, heads, s_q)): the softmax backward's per-row term,
    the same for every block of keys, so computed once."""
    return (grad_out.float() * out.float()).sum(dim=-1)


def sum_kv_head_groups(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The backward of ``repeat_kv_heads``: (batch, heads, s, d) -> (batch, kv_heads, s, d),
    summing each KV head's group of consecutive query heads."""
    batch, heads, seq, dim = grad.shape
    return grad.view(batch, kv_heads, heads // kv_heads, seq, dim).sum(dim=2)


def block_attention_backward(q, k, v, grad_out, lse, out_dot_grad,
                             q_positions=None, k_positions=None):
    """(dq, dk, dv), fp32, of one block: the probabilities recomputed from the row's *final*
    ``lse`` (over all blocks), so these are this block's exact shares of the gradients;
    ``out_dot_grad`` is :func:`output_dot_grad` of the final output. dk, dv have kv_heads."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k_all, v_all = repeat_kv_heads(k, heads), repeat_kv_heads(v, heads)
    scores = _scores(q, k_all, visible_keys(q_positions, k_positions))
    probabilities = (scores - _finite(lse)[..., None]).exp()
    grad_out = grad_out.to(v.dtype)
    grad_v = probabilities.to(v.dtype).transpose(-2, -1) @ grad_out
    grad_probabilities = (grad_out @ v_all.transpose(-2, -1)).float()
    grad_scores = probabilities * (grad_probabilities - out_dot_grad[..., None])
    grad_scores = (grad_scores / math.sqrt(q.shape[-1])).to(q.dtype)
    grad_q = (grad_scores @ k_all).float()
    grad_k = grad_scores.transpose(-2, -1) @ q
    return (grad_q, sum_kv_head_groups(grad_k.float(), kv_heads),
            sum_kv_head_groups(grad_v.float(), kv_heads))
