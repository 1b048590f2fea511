"""Lab 8, graded: the online-softmax merge (``online_softmax.merge_partials``; Milakov &
Gimelshein 2018, Dao et al. 2022), on its own, in one helper process without ranks.

The keys of one attention problem (batch 3, heads 2, 6 queries, 9 keys, head_dim 4, fp32) are
cut into blocks; each block's partial result (out, lse), the softmax over that block's visible
keys applied to its values and the rows' log-sum-exp, is computed here, and the submission
merges them: two blocks, the same two in the other order, and three blocks one after another.
The merged (out, lse) must be attention over all the keys, computed here on the whole problem,
within 1e-6 (fp32; observed about 2e-7). The visibility is chosen so that some rows see no key
of one block (lse = -inf, out = 0 there) and one row sees no key at all: it must come out as
(0, -inf), not NaN.
"""
import math

import pytest
import torch

pytestmark = pytest.mark.lab8

BATCH, HEADS, QUERIES, KEYS, DIM = 3, 2, 6, 9, 4
BLOCKS = [range(0, 4), range(4, 9)]
THREE_BLOCKS = [range(0, 2), range(2, 6), range(6, 9)]
TOLERANCE = dict(atol=1e-6, rtol=1e-6)


def problem():
    generator = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(BATCH, HEADS, length, DIM, generator=generator)
               for length in (QUERIES, KEYS, KEYS))
    visible = torch.ones(QUERIES, KEYS, dtype=torch.bool)
    visible[0] = False  # query 0 sees nothing at all
    visible[1, 4:] = False  # query 1 sees nothing of the second block
    visible[2, :4] = False  # query 2 nothing of the first
    visible[3, 1:7] = False  # query 3 one key of the first two blocks of three, two of the third
    return q, k, v, visible


def attention_over(q, k, v, visible, keys=None):
    """(out, lse) of q over the keys ``keys`` (all if None): softmax of the visible scores, a
    row that sees none of them (0, -inf)."""
    keys = list(keys if keys is not None else range(KEYS))
    scores = (q @ k[:, :, keys].transpose(-2, -1)) / math.sqrt(DIM)
    scores = scores.masked_fill(~visible[:, keys], float("-inf"))
    lse = scores.logsumexp(dim=-1)
    weights = (scores - lse.masked_fill(lse == float("-inf"), 0.0)[..., None]).exp()
    return weights @ v[:, :, keys], lse


def merged_alone(impl, parts, three):
    """The submission's merges of ``parts`` (two blocks' (out, lse)) in both orders, and of
    ``three`` (three blocks') left to right; an error as text."""
    merge = impl.module("online_softmax").merge_partials
    try:
        (out1, lse1), (out2, lse2) = parts
        found = {"forward": merge(out1, lse1, out2, lse2), "reversed": merge(out2, lse2, out1, lse1)}
        out, lse = three[0]
        for block_out, block_lse in three[1:]:
            out, lse = merge(out, lse, block_out, block_lse)
        found["three"] = (out, lse)
        return {name: (out.detach().clone(), lse.detach().clone()) for name, (out, lse) in found.items()}
    except Exception as error:  # named in the test
        return f"{type(error).__name__}: {error}"


def wrong_merge(parts, out, lse):
    """The usual mistake that gives ``out`` and ``lse`` from ``parts``, or None."""
    (out1, lse1), (out2, lse2) = parts
    seen = (lse1 > float("-inf")) & (lse2 > float("-inf"))  # rows that see both blocks
    close = lambda a, b: torch.allclose(a[seen], b[seen], **TOLERANCE)  # noqa: E731
    if close(out, out1 + out2):
        return ("the partial outputs were added without rescaling by exp(lse_i - lse): each is "
                "normalised over its own block's keys only, so each weighs by its block's share "
                "of the row's softmax mass")
    if close(out, (out1 + out2) / 2):
        return ("the partial outputs were averaged, not rescaled by exp(lse_i - lse): the blocks' "
                "shares of the row's softmax mass are not one half each")
    if close(out, lse1.exp()[..., None] * out1 + lse2.exp()[..., None] * out2):
        return ("each partial output was weighed by exp(lse_i), not rescaled by exp(lse_i - lse): "
                "divide by the merged sum of exponentials")
    if torch.allclose(lse[seen], torch.maximum(lse1, lse2)[seen], **TOLERANCE):
        return ("lse is the larger of the two, not the log of the summed exponentials: "
                "lse = log(exp(lse1) + exp(lse2)) (torch.logaddexp)")
    if torch.allclose(lse[seen], (lse1 + lse2)[seen], **TOLERANCE):
        return ("the two lse were added: the blocks' sums of exponentials add, so lse = "
                "log(exp(lse1) + exp(lse2)) (torch.logaddexp)")
    return None


def test_merge_of_partial_attention_is_attention_over_all_keys(impl, run_alone):
    q, k, v, visible = problem()
    parts = [attention_over(q, k, v, visible, keys) for keys in BLOCKS]
    three = [attention_over(q, k, v, visible, keys) for keys in THREE_BLOCKS]
    expected_out, expected_lse = attention_over(q, k, v, visible)
    found = run_alone(merged_alone, impl, parts, three)
    assert not isinstance(found, str), f"merge_partials raised {found}"
    for name, (out, lse) in found.items():
        what = {"forward": "merge_partials(block 1, block 2)", "reversed": "merge_partials(block 2, "
                "block 1)", "three": "three blocks merged one after another"}[name]
        assert out.shape == expected_out.shape and lse.shape == expected_lse.shape, (
            f"{what} gave out {tuple(out.shape)}, lse {tuple(lse.shape)}: expected out "
            f"{tuple(expected_out.shape)} (batch, heads, s_q, d), lse {tuple(expected_lse.shape)}")
        if torch.isnan(out).any() or torch.isnan(lse).any():
            rows = sorted({int(i) for i in torch.isnan(out).any(-1).nonzero()[:, -1].tolist()}
                          | {int(i) for i in torch.isnan(lse).nonzero()[:, -1].tolist()})
            pytest.fail(f"{what}: query rows {rows} became NaN. Query 0 sees no key of either "
                        "block (lse = -inf in both): exp(lse_i - lse) is then exp(-inf - (-inf)) "
                        "= NaN; such a row must stay (out 0, lse -inf), a row that sees nothing "
                        "adds nothing")
        nothing = ~visible.any(dim=-1)
        assert (lse[..., nothing] == float("-inf")).all() and (out[..., nothing, :] == 0).all(), (
            f"{what}: query 0 sees no key at all, so its merged (out, lse) must be (0, -inf); got "
            f"out {out[0, 0, 0].tolist()}, lse {lse[0, 0, 0].item()}")
        if name != "three":
            cause = wrong_merge(parts if name == "forward" else parts[::-1], out, lse)
            assert cause is None, f"{what}: {cause}"
        for value, expected, label in ((lse, expected_lse, "lse"), (out, expected_out, "out")):
            finite = expected_lse > float("-inf")
            assert torch.allclose(value[finite], expected[finite], **TOLERANCE), (
                f"{what}: the merged {label} differs from attention over all the keys by up to "
                f"{(value[finite] - expected[finite]).abs().max().item():.3g} (tolerance 1e-6): "
                "lse = logaddexp(lse1, lse2), out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2; "
                "rows that see no key of one block (lse_i = -inf) take the other block's whole")
