"""The planner's 70B answer against practice: the public recipes' layouts (practice.py) run on
the same 16 x 8 H100 and batch, why the pick differs from them, how the pick moves with the
global batch and with TP overlap, and how far the estimate is off on the H100 (the facts lab 7
and its deck state)."""

from reference_impl.perf.planner import Layout, cluster_of, evaluate, get_model, plan, recommend
from reference_impl.perf.planner.cluster_compute import BEST_CASE
from reference_impl.perf.planner.explain import batch_sensitivity, practice_comparison, trust
from reference_impl.perf.planner.practice import practice_layouts, practice_plans
from reference_impl.perf.planner.published_runs import LLAMA3
from reference_impl.perf.planner.validation import compare

H100 = cluster_of("h100", nodes=16)
MODEL = get_model("70b")
PICK = recommend(MODEL, H100, 1024)[0]
PRACTICE = dict((recipe.name, p) for recipe, p in practice_plans(MODEL, H100, 1024))


def split(p) -> tuple:
    lay = p.layout
    return lay.tp, lay.pp, lay.v, lay.cp, lay.dp


def test_the_70b_answer_at_4m_tokens():
    assert split(PICK) == (2, 4, 2, 4, 4) and PICK.fits
    assert 0.45 < PICK.mfu < 0.55


def test_practice_layouts_fit_here_and_lose_to_the_pick_by_the_estimate():
    assert set(PRACTICE) == {"NeMo Llama 2 70B", "NeMo Llama 3 70B", "torchtitan 70B"}
    assert split(PRACTICE["NeMo Llama 2 70B"]) == (4, 4, 20, 1, 8)
    assert split(PRACTICE["NeMo Llama 3 70B"]) == (4, 4, 5, 2, 4)
    assert split(PRACTICE["torchtitan 70B"]) == (8, 1, 1, 1, 16)
    for name, p in PRACTICE.items():
        assert p.fits, name
        assert p.step_s > PICK.step_s, name
    assert PRACTICE["NeMo Llama 2 70B"].step_s < 1.1 * PICK.step_s


def test_nemo_loses_on_tp_communication_and_overlap_narrows_the_gap():
    nemo = PRACTICE["NeMo Llama 2 70B"].time.breakdown()
    pick = PICK.time.breakdown()
    gaps = {term: nemo[term] - pick[term] for term in nemo}
    assert max(gaps, key=gaps.get) == "TP"
    # overlapped as tp_comm_overlap runs (one chunk in tp exposed) the gap narrows, TP 2 stays
    overlap = dict((r.name, p) for r, p in practice_plans(MODEL, H100, 1024, True))
    picked = recommend(MODEL, H100, 1024, tp_comm_overlap=True)[0]
    assert split(picked)[:2] == (2, 4)
    assert (overlap["NeMo Llama 2 70B"].step_s / picked.step_s
            < PRACTICE["NeMo Llama 2 70B"].step_s / PICK.step_s)
    # the best case (the bound, no cluster terms): TP nearly free, NeMo's own TP 4 x PP 4 x 20
    # virtual stages fits (usable memory is the GPU less the CUDA context and NCCL) and wins
    best = recommend(MODEL, cluster_of("h100", 16, terms=BEST_CASE), 1024, tp_comm_overlap=True)[0]
    assert split(best) == (4, 4, 20, 1, 8) and best.step_s < PICK.step_s


def test_the_pick_at_smaller_global_batches():
    at = {batch: split(plan(MODEL, H100, batch)[0]) for batch in (128, 32)}
    assert at[128][:2] == at[32][:2] == split(PICK)[:2], "the split stays TP 2 x PP 4"
    assert split(PICK)[2] < at[128][2] < at[32][2], "more chunks as the bubble grows"
    text = batch_sensitivity(MODEL, H100, [1024, 32])
    assert "TP2 PP4 v2 CP4 DP4 mb1" in text and "TP2 PP4 v10 CP4 DP4 mb1" in text


def test_the_comparison_names_the_recipes_and_their_sources():
    text = practice_comparison(PICK)
    for recipe in practice_layouts(MODEL):
        assert recipe.name in text and recipe.source in text
    assert "the planner's pick" in text and "FP8" in text
    assert "no public recipe" in practice_comparison(
        evaluate(get_model("7b"), H100, Layout(1, 1, 128), 1024))


def test_the_estimate_on_llama3_405b_on_h100_and_what_it_says():
    h100_rows = [c for c in compare() if c.run.source == LLAMA3 and c.error is not None]
    assert len(h100_rows) == 2
    assert all(abs(c.error) < 0.05 for c in h100_rows)
    assert all(c.plan.layout.v == 8 and c.plan.layout.embedding_in_split for c in h100_rows)
    assert all(c.plan.fits for c in h100_rows), "the layout trained on 80 GB H100s"
    text = trust(H100.gpu.name)
    assert "optimistic by about 2%" in text and "Llama 3 405B" in text


def test_a_recipe_that_does_not_divide_the_cluster_says_why():
    rows = practice_plans(MODEL, cluster_of("h100", nodes=3), 96)
    reasons = [p for _, p in rows if isinstance(p, str)]
    assert reasons and all("does not divide" in r or "not divisible" in r for r in reasons)
