"""Lab 8, hidden checks: the public checks' functions on other seeds, sizes, heads and CP
layouts (the same messages).

* the layout: cp 5 to 16 with 4 and 5 tokens per chunk, and more drawn;
* the merge: other draws of blocks, queries and magnitudes;
* one backward step alone: 6 query heads over 3 or 2 KV heads, 4 KV heads of 4, 4 and 5 tokens
  per chunk, cp 1 to 4;
* the ring, forward and backward, on 4 ranks: the same heads and longer chunks, the CP groups
  of another seed (other permutations), every kind of numbers of the public sweep (bf16 with
  scores near 50 among them: running statistics kept in bf16).
"""
import pytest

from test_lab8_load_balance import check_chunks, check_positions, check_visible, layouts
from test_lab8_online_softmax import check_merges
from test_lab8_online_softmax import cases as merge_cases
from test_lab8_ring_attention import NUMBERS, check_world
from test_lab8_ring_backward import NUMBERS as STEP_NUMBERS
from test_lab8_ring_backward import cases as step_cases
from test_lab8_ring_backward import check_backward_steps
from reference_impl.course.contracts import assert_contract
from test_lab8_contracts import MERGE, merge_draws

pytestmark = pytest.mark.lab8
CONTRACT_SEED = 104729  # added to the sweep's seed: the contracts' other draws

OTHER = 7919  # added to the sweep's seed: other draws than the public checks'
LONG_CHUNKS = [(cp, chunk) for cp in (5, 7, 11, 13, 16) for chunk in (4, 5)]
SHAPES = ["2x6x3", "1x6x2", "2x4x4"]  # batch x heads x kv_heads
STEP_SPACE = {"cp": [1, 2, 3, 4], "shape": SHAPES, "chunk": [4, 5], "numbers": list(STEP_NUMBERS)}
RING_SPACE = {"shape": SHAPES, "chunk": [2, 4], "numbers": list(NUMBERS)}


def test_hidden_layout_of_long_chunks(impl, run_alone, sweep_seed):
    cases = layouts(sweep_seed + OTHER, fixed=LONG_CHUNKS, drawn=3, chunks=(4, 5))
    check_chunks(impl, run_alone, cases, sweep_seed + OTHER)
    check_positions(impl, run_alone, cases, sweep_seed + OTHER)
    check_visible(impl, run_alone, cases, sweep_seed + OTHER)


def test_hidden_merge_of_other_draws(impl, run_alone, sweep_seed):
    check_merges(impl, run_alone, merge_cases(sweep_seed + OTHER), sweep_seed + OTHER)


def test_hidden_backward_step_with_other_heads(impl, run_alone, sweep_seed):
    seed = sweep_seed + OTHER
    check_backward_steps(impl, run_alone, step_cases(seed, STEP_SPACE), seed)


def test_hidden_ring_on_other_layouts_and_heads(impl, run_on_ranks, sweep_seed):
    check_world(4, impl, run_on_ranks, sweep_seed + OTHER, RING_SPACE)


def test_hidden_merge_contract_on_other_shapes(impl, run_alone, sweep_seed):
    seed = sweep_seed + CONTRACT_SEED
    draws = {**merge_draws(seed, (1, 4, 7, 8)), **merge_draws(seed + 1, (3, 1, 3, 2))}
    assert_contract(run_alone, impl, "online_softmax", "merge_partials", MERGE, draws)
