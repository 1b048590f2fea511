"""Lab 8, graded: the online-softmax merge (``online_softmax.merge_partials``; Milakov &
Gimelshein 2018, Dao et al. 2022), on its own, in one helper process without ranks.

The keys of one attention problem (batch 3, heads 2, head_dim 4) are cut into blocks; each
block's partial result (out, lse), the softmax over that block's visible keys applied to its
values and the rows' log-sum-exp, is computed here in float64 and handed to the submission in
fp32, which merges the blocks left to right and right to left. The merged (out, lse) must be
attention over all the keys, computed here in float64 on the whole problem.

What is swept (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws other cases, and every
failure prints its seed and case): blocks of 4+5, 1+8, 2+4+3 and 3+3+3+3 keys (uneven, one of a
single key), 6 or 7 queries, and the scores' magnitude: randn-sized (lse about 2), lifted so
that lse is about 95 (exp(95) overflows fp32, whose largest number is about e^88.7), blocks at
95 and at 5 (one block's weight is e^-90), and lowered to lse about -100 (exp(-100) is below
fp32's smallest normal number). Only a merge that never forms an exp(lse) on its own survives
all of them.

In every case some rows see no key of one block (lse = -inf, out = 0 there) and query 0 sees no
key at all: it must come out as (0, -inf), not NaN. The merge must not write into its inputs
(in ring attention they are views of the running output). Tolerances, against float64: lse
within atol 1e-6 + rtol 1e-6 (observed 2e-7 at lse ~2, 4e-6 at ~95: fp32's spacing there is
7.6e-6), out within atol 3e-5, rtol 1e-6 (observed up to 1.2e-5 at lse ~95, over
seeds 0 to 39).
"""
import zlib

import pytest
import torch

from reference_impl.checks import assert_close_naming
from reference_impl.course.sweeps import draw, label

pytestmark = pytest.mark.lab8

BATCH, HEADS, DIM = 3, 2, 4
BLOCKS = {"4+5": (4, 5), "1+8": (1, 8), "2+4+3": (2, 4, 3), "3+3+3+3": (3, 3, 3, 3)}
MAGNITUDES = {"lse ~2": (0.0, 0.0), "lse ~95": (95.0, 95.0), "lse ~95 and ~5": (95.0, 5.0),
              "lse ~-100": (-100.0, -100.0)}  # the score offsets of the odd and even blocks
SPACE = {"blocks": list(BLOCKS), "queries": [6, 7], "magnitude": list(MAGNITUDES)}
LSE_TOLERANCE = dict(atol=1e-6, rtol=1e-6)
OUT_TOLERANCE = dict(atol=3e-5, rtol=1e-6)
ORDERS = ("left to right", "right to left")
INPUTS = ("out1", "lse1", "out2", "lse2")


def cases(seed: int) -> list[dict]:
    return draw(SPACE, seed, extra=2)


def problem(config: dict, seed: int):
    """Scores (batch, heads, queries, keys) and values, float64, and which query sees which
    key: query 0 nothing, query 1 nothing past the first block, query 2 nothing of it, query 3
    about half the keys."""
    sizes, queries = BLOCKS[config["blocks"]], config["queries"]
    keys = sum(sizes)
    generator = torch.Generator().manual_seed(zlib.crc32(label(config, seed).encode()))
    scores = torch.randn(BATCH, HEADS, queries, keys, generator=generator, dtype=torch.float64)
    odd, even = MAGNITUDES[config["magnitude"]]
    for index, block in enumerate(key_blocks(config)):
        scores[..., block] += odd if index % 2 == 0 else even
    values = torch.randn(BATCH, HEADS, keys, DIM, generator=generator, dtype=torch.float64)
    visible = torch.ones(queries, keys, dtype=torch.bool)
    visible[0] = False
    visible[1, sizes[0]:] = False
    visible[2, :sizes[0]] = False
    visible[3] = torch.rand(keys, generator=generator) < 0.5
    return scores, values, visible


def key_blocks(config: dict) -> list[range]:
    sizes, start, blocks = BLOCKS[config["blocks"]], 0, []
    for size in sizes:
        blocks.append(range(start, start + size))
        start += size
    return blocks


def attention_over(scores, values, visible, keys):
    """(out, lse) of the rows over the keys ``keys``, float64: softmax of the visible scores;
    a row that sees none of them (0, -inf)."""
    keys = list(keys)
    masked = scores[..., keys].masked_fill(~visible[:, keys], float("-inf"))
    lse = masked.logsumexp(dim=-1)
    weights = (masked - lse.masked_fill(lse == float("-inf"), 0.0)[..., None]).exp()
    return weights @ values[..., keys, :], lse


def partials(config: dict, seed: int):
    """Every block's (out, lse), fp32 (what the submission merges), the whole problem's and the
    first two blocks' together (float64)."""
    scores, values, visible = problem(config, seed)
    blocks = key_blocks(config)
    parts = [tuple(t.float() for t in attention_over(scores, values, visible, block))
             for block in blocks]
    first_two = attention_over(scores, values, visible, [*blocks[0], *blocks[1]])
    return parts, attention_over(scores, values, visible, range(scores.shape[-1])), first_two


def merged_alone(impl, configs, seed: int):
    """{case label: {order: (out, lse), "overwrote": [names]}} of the submission's merges; an
    error as text."""
    merge = impl.module("online_softmax").merge_partials
    found = {}
    for config in configs:
        parts, _, _ = partials(config, seed)
        try:
            found[label(config, seed)] = merged_in_orders(merge, parts)
        except Exception as error:  # named in the test, with the case
            found[label(config, seed)] = f"{type(error).__name__}: {error}"
    return found


def merged_in_orders(merge, parts) -> dict:
    """The blocks merged one after another in each order, and the inputs a merge wrote into."""
    first = merge(*parts[0], *parts[1])
    result, overwrote = {"first two": tuple(t.detach().clone() for t in first)}, []
    for order in ORDERS:
        chain = parts if order == ORDERS[0] else parts[::-1]
        out, lse = chain[0]
        for block_out, block_lse in chain[1:]:
            inputs = (out, lse, block_out, block_lse)
            kept = [t.clone() for t in inputs]
            out, lse = merge(*inputs)
            overwrote += [name for name, before, after in zip(INPUTS, kept, inputs)
                          if not unchanged(before, after) and name not in overwrote]
            out, lse = out.detach().clone(), lse.detach().clone()
        result[order] = (out, lse)
    result["overwrote"] = overwrote
    return result


def unchanged(before: torch.Tensor, after: torch.Tensor) -> bool:
    """The same values (NaN where NaN was: an earlier merge's NaN is not a write)."""
    return before.shape == after.shape and torch.allclose(before, after, rtol=0, atol=0,
                                                          equal_nan=True)


def wrong_merge(parts, out, lse):
    """The usual mistake that gives ``out`` and ``lse`` from two blocks' ``parts``, or None."""
    (out1, lse1), (out2, lse2) = parts
    seen = (lse1 > float("-inf")) & (lse2 > float("-inf"))  # rows that see both blocks
    close = lambda a, b: torch.allclose(a[seen], b[seen], **OUT_TOLERANCE)  # noqa: E731
    if close(out, out1 + out2):
        return ("the partial outputs were added without rescaling: each is normalised over its "
                "own block's keys only. What share of the row's softmax mass does each block "
                "hold?")
    if close(out, (out1 + out2) / 2):
        return ("the partial outputs were averaged: the blocks' shares of the row's softmax mass "
                "are not one half each. What are they?")
    if close(out, lse1.exp()[..., None] * out1 + lse2.exp()[..., None] * out2):
        return ("each partial output was weighed by its block's sum of exponentials, exp(lse_i): "
                "a share of the row's softmax mass is a part over the whole")
    if torch.allclose(lse[seen], torch.maximum(lse1, lse2)[seen], **LSE_TOLERANCE):
        return ("lse is the larger of the two, not the log of the summed exponentials: the merged "
                "lse is the log-sum-exp of the row's scores over both blocks' keys")
    if torch.allclose(lse[seen], (lse1 + lse2)[seen], **LSE_TOLERANCE):
        return ("the two lse were added: when two blocks merge, what adds, their lse or their "
                "sums of exponentials?")
    return None


def pair_is_right(first_two, out, lse) -> bool:
    """Whether two blocks' merge is attention over both blocks' keys (``first_two``, float64):
    where it is, no mistake is named, though one may give the same values (the larger lse, at
    lse 95 and 5)."""
    right_out, right_lse = first_two
    seen = right_lse > float("-inf")
    return torch.allclose(out.double()[seen], right_out[seen], **OUT_TOLERANCE) and \
        torch.allclose(lse.double()[seen], right_lse[seen], **LSE_TOLERANCE)


def rows_of(mask: torch.Tensor) -> list[int]:
    """The query rows where ``mask`` (batch, heads, queries[, d]) is anywhere True."""
    while mask.dim() > 3:
        mask = mask.any(dim=-1)
    return sorted({int(i) for i in mask.nonzero()[:, -1].tolist()})


def not_finite_cause(what, config, out, lse, expected_lse) -> str | None:
    """Why the merged values are NaN or infinite where they must not be, or None."""
    nothing = expected_lse == float("-inf")  # rows that see no key at all
    bad_out, bad_lse = ~torch.isfinite(out), torch.isnan(lse) | (lse == float("inf"))
    if (bad_out.any(-1) & nothing).any() or (torch.isnan(lse) & nothing).any():
        return (f"{what}: query rows {rows_of(bad_out.any(-1) & nothing | torch.isnan(lse) & nothing)} "
                "became NaN. Query 0 sees no key of any block (lse = -inf in both), and -inf less "
                "-inf is NaN; such a row must stay (out 0, lse -inf), a row that sees nothing adds "
                "nothing")
    bad = bad_out.any(-1) | bad_lse | ((lse == float("-inf")) & ~nothing)
    if not bad.any():
        return None
    return (f"{what}: query rows {rows_of(bad)} became NaN or infinite, or -inf though they see "
            f"keys, with partial lse near {MAGNITUDES[config['magnitude']][0]:g}: the merge "
            "overflows or underflows. exp(95) is beyond fp32's largest number (about e^88.7) and "
            "exp(-100) below its smallest normal one, so no exp(lse) may be formed on its own: "
            "which quantities of the merge stay between 0 and 1?")


def check_case(config, seed, found, parts, expected, first_two) -> None:
    """One case's merges, in both orders: raised, inputs written, shapes, NaN, the empty row,
    the usual mistakes, then the values."""
    case = label(config, seed)
    assert not isinstance(found, str), f"merge_partials raised {found} [{case}]"
    assert not found["overwrote"], (
        f"merge_partials [{case}]: the merge overwrote its caller's input "
        f"{', '.join(found['overwrote'])} (merge_partials(out1, lse1, out2, lse2)): compute new "
        "tensors instead of writing into the arguments (in-place operations such as mul_, add_ "
        "or out1[...] = ...); in ring attention they are views of the running output")
    expected_out, expected_lse = expected
    out, lse = found["first two"]
    known = wrong_merge(parts[:2], out, lse) if out.shape == expected_out.shape \
        and not pair_is_right(first_two, out, lse) else None
    assert known is None, f"merge_partials(block 1, block 2) [{case}]: {known}"
    for order in ORDERS:
        out, lse = found[order]
        what = f"merge_partials, {len(parts)} blocks merged {order} [{case}]"
        assert out.shape == expected_out.shape and lse.shape == expected_lse.shape, (
            f"{what} gave out {tuple(out.shape)}, lse {tuple(lse.shape)}: expected out "
            f"{tuple(expected_out.shape)} (batch, heads, s_q, d), lse {tuple(expected_lse.shape)}")
        cause = not_finite_cause(what, config, out, lse, expected_lse)
        assert cause is None, cause
        nothing = expected_lse == float("-inf")
        assert (lse[nothing] == float("-inf")).all() and (out[nothing] == 0).all(), (
            f"{what}: query 0 sees no key at all, so its merged (out, lse) must be (0, -inf); got "
            f"out up to {out[nothing].abs().max().item():.3g}, lse {lse[nothing].max().item():.3g}")
        finite = ~nothing
        hint = ("the merged lse is the log-sum-exp of the row's scores over both blocks' keys, and "
                "each block's out counts by its share of the row's softmax mass; rows that see no "
                "key of one block (lse_i = -inf) take the other block's whole")
        for value, wanted, name, tolerance in ((lse, expected_lse, "lse", LSE_TOLERANCE),
                                               (out, expected_out, "out", OUT_TOLERANCE)):
            assert_close_naming(value[finite], wanted[finite], f"{what}: the merged {name} of the "
                                "rows that see a key", mistakes={}, otherwise=hint,
                                against="attention over all the keys (float64)", **tolerance)


def check_merges(impl, run_alone, configs: list[dict], seed: int) -> None:
    """The submission's merges of every case against attention over all the keys."""
    found = run_alone(merged_alone, impl, configs, seed)
    failure = ""
    for config in configs:
        parts, expected, first_two = partials(config, seed)
        try:
            check_case(config, seed, found[label(config, seed)], parts, expected, first_two)
        except AssertionError as error:  # the message says it all
            failure = str(error).split("\nassert ")[0]  # without pytest's rewritten operands
            break
    if failure:
        pytest.fail(failure, pytrace=False)


def test_merge_of_partial_attention_is_attention_over_all_keys(impl, run_alone, sweep_seed):
    check_merges(impl, run_alone, cases(sweep_seed), sweep_seed)
