"""The planner on mixture-of-experts models: total and active parameters (a published MoE and a
small one counted by hand), FLOPs from the active ones, model-state memory falling with expert
parallelism, the all-to-all term against its formula, the EP rules, and a plan chosen for
Mixtral 8x7B (from the library and the command line)."""
import pytest

from reference_impl.perf.planner import Layout, cluster_of, evaluate, get_model, recommend
from reference_impl.perf.planner.cli import main
from reference_impl.perf.planner.layout import candidate_layouts
from reference_impl.perf.planner.model_spec import ModelSpec
from reference_impl.perf.planner.specs import model_from
from reference_impl.perf.planner.time_estimate import all_to_all_seconds

MIXTRAL = get_model("mixtral-8x7b")
H100_64 = cluster_of("h100", 8)
# 2 layers, hidden 8, 2 heads (MHA), vocab 10, plain MLP of 16 per expert, 4 experts, top-2
TINY = ModelSpec("tiny-moe", 2, 8, 2, 10, 4, ffn_hidden=16, experts=4, top_k=2)


def test_mixtral_8x7b_has_its_published_parameter_counts():
    # Jiang et al. 2024, "Mixtral of Experts": 47B parameters, 13B active per token; the model
    # card's 46.7B and 12.9B. Tolerance 0.5%: the count leaves out the norms (0.27M).
    assert MIXTRAL.num_params == pytest.approx(46.7e9, rel=5e-3)
    assert MIXTRAL.active_params == pytest.approx(12.9e9, rel=5e-3)


def test_a_small_moe_counted_by_hand():
    attention = 8 * (8 + 2 * 8) + 8 * 8  # fused qkv, output projection
    expert = 8 * 16 + 16 * 8
    router = 8 * 4
    embeddings = 2 * 10 * 8
    assert TINY.num_params == 2 * (attention + 4 * expert + router) + embeddings
    assert TINY.active_params == 2 * (attention + 2 * expert + router) + embeddings
    assert TINY.model_flops_per_token() == 6 * TINY.active_params + 12 * 2 * 8 * 4
    dense = ModelSpec("dense", 2, 8, 2, 10, 4, ffn_hidden=16)
    assert dense.active_params == dense.num_params == 2 * (attention + expert) + embeddings


def test_memory_per_gpu_falls_with_ep():
    memory = [evaluate(MIXTRAL, H100_64, Layout(2, 1, 32, ep=ep), 512).memory_bytes
              for ep in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(memory, memory[1:])), memory
    # What moves is the experts' states: at ep 8 a GPU holds 1 of the 8 experts' tp-shards
    # instead of all 8. Megatron's 6 + 12/d bytes per parameter: the 6 (bf16 weight, fp32
    # gradient) go with 7/8 of them; the optimizer's 12/d stay, d falling from dp 32 to 32/8
    experts_per_gpu = MIXTRAL.layers * MIXTRAL.expert_params_per_layer / 2  # tp 2
    optimizer = 12 * experts_per_gpu / 32 - 12 * (experts_per_gpu / 8) / 4
    assert memory[0] - memory[-1] == pytest.approx(6 * experts_per_gpu * 7 / 8 + optimizer)


def test_the_all_to_all_term_is_the_formula():
    layout = Layout(2, 1, 32, ep=4, micro_batch=2)
    alpha, bandwidth = H100_64.link(2 * 4)  # tp x ep = 8 GPUs: inside a node
    rows = 2 * 4096 * 2  # micro-batch x sequence x top-k
    # dispatch + combine, forward + backward; (ep-1)/ep of the rows leave, 2 bytes each value
    expected = 2 * 2 * (3 * alpha + rows * 4096 * 2 * 3 / 4 / bandwidth)
    assert all_to_all_seconds(MIXTRAL, H100_64, layout) == pytest.approx(expected)
    plan = evaluate(MIXTRAL, H100_64, layout, 512)
    assert plan.time.ep_exposed_s == pytest.approx(expected)
    assert sum(plan.time.breakdown().values()) == pytest.approx(plan.step_s)
    assert all_to_all_seconds(MIXTRAL, H100_64, Layout(2, 1, 32)) == 0.0


@pytest.mark.parametrize("model, layout, message", [
    (get_model("70b"), Layout(8, 1, 8, ep=2), "ep 2 needs a mixture-of-experts model"),
    (MIXTRAL, Layout(8, 1, 8, ep=16), "the data-parallel size dp = 8 is not divisible by ep = 16"),
    (MIXTRAL, Layout(4, 1, 16, ep=16), "8 experts are not divisible by ep = 16"),
])
def test_ep_rules_name_the_numbers(model, layout, message):
    with pytest.raises(ValueError, match=message):
        evaluate(model, H100_64, layout, 512)


def test_top_k_must_be_within_the_experts():
    with pytest.raises(ValueError, match="top_k must be between 1 and the 4 experts, got 5"):
        ModelSpec("bad", 2, 8, 2, 10, 4, experts=4, top_k=5)


def test_the_search_covers_ep_and_a_plan_is_chosen_for_mixtral():
    degrees = {layout.ep for layout in candidate_layouts(MIXTRAL, H100_64, 512)}
    assert degrees == {1, 2, 4, 8}
    assert all(layout.dp % layout.ep == 0 for layout in candidate_layouts(MIXTRAL, H100_64, 512))
    best, runner_up = recommend(MIXTRAL, H100_64, 512)
    assert best.fits and best.step_s <= runner_up.step_s
    assert best.layout.ep > 1, best.layout.describe()  # experts spread: their states shrink
    assert 0.2 < best.mfu < 0.8  # from the active parameters' FLOPs


def test_the_cli_plans_the_mixtral_preset_and_reads_moe_keys(capsys):
    main(["--preset", "mixtral-8x7b", "--nodes", "8", "--global-batch", "512", "--top", "3"])
    out = capsys.readouterr().out
    assert "layouts fit" in out and "EP" in out
    text = "layers=32,hidden=4096,heads=32,kv_heads=8,vocab=32000,seq=4096,ffn=14336,gated=1,"
    assert model_from(text + "experts=8,top_k=2,name=mixtral-8x7b") == MIXTRAL
    main(["--preset", "mixtral-8x7b", "--evaluate", "tp=2,pp=1,dp=32,ep=4", "--global-batch", "512"])
    assert "EP 4" in capsys.readouterr().out
