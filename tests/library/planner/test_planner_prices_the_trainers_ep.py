"""The planner's expert-parallel axis is priced on the layout the trainer runs: for the kit's
MoE GPT under ep 2 x dp 4, the planner's parameters per GPU are the trainer's weight matrices
on a rank (experts E / ep of them, the dense part whole; the planner counts matrices only, and
no learned position embedding), and the planner's expert-state shards (dp x cp / ep) are the
trainer's EDP group. Exact: these are counts."""
import torch
import torch.distributed as dist

from reference_impl import train
from reference_impl.comm.launcher import launch
from reference_impl.hybrid.parallelize import parallelize_gpt
from reference_impl.moe.expert_parallel import is_expert_parameter
from reference_impl.perf.planner.layout import Layout
from reference_impl.perf.planner.memory_estimate import estimate_memory
from reference_impl.perf.planner.model_spec import ModelSpec

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, EXPERTS, EP, DP = 2, 16, 2, 8, 32, 4, 2, 4


def held_by_rank(args, plan) -> dict:
    """This rank's weight matrices, expert and dense, and its EP and EDP group sizes."""
    model = parallelize_gpt(train.build_gpt(args), plan, plan.dims.build())
    held = {"expert": 0, "dense": 0, "position": 0}
    for name, parameter in model.named_parameters():
        if parameter.dim() == 2:
            kind = ("expert" if is_expert_parameter(parameter)
                    else "position" if "position_embedding" in name else "dense")
            held[kind] += parameter.numel()
    groups = model.context.experts
    return {**held, "ep": dist.get_world_size(groups.ep), "edp": dist.get_world_size(groups.edp)}


def test_the_planners_ep_layout_is_the_trainers():
    args = train.parse_args(f"--layers {LAYERS} --hidden {HIDDEN} --heads {HEADS} --seq {SEQ} "
                            f"--vocab {VOCAB} --batch 8 --experts {EXPERTS} --ep {EP} "
                            f"--dp {DP}".split())
    torch.manual_seed(0)
    ranks = launch(held_by_rank, DP, args, train.check_composition(args))
    spec = ModelSpec("tiny-moe", LAYERS, HIDDEN, HEADS, VOCAB, SEQ, experts=EXPERTS, top_k=2)
    layout = Layout(tp=1, pp=1, dp=DP, ep=EP)
    planned = estimate_memory(spec, layout, microbatches=1)
    experts_per_gpu = LAYERS * spec.expert_params_per_layer / EP
    for rank, held in enumerate(ranks):
        assert held["expert"] == experts_per_gpu, (
            f"rank {rank} holds {held['expert']} expert weights, the planner prices "
            f"{experts_per_gpu} (experts / ep of every layer's)")
        assert held["expert"] + held["dense"] == planned.params_per_gpu, (
            f"rank {rank}: {held['expert']} + {held['dense']} weights, the planner "
            f"{planned.params_per_gpu}")
        assert (held["ep"], held["edp"]) == (EP, layout.dp * layout.cp // EP), (
            f"rank {rank}: EP x EDP groups {held['ep']} x {held['edp']}, the planner shards "
            f"expert states over dp x cp / ep = {layout.dp * layout.cp // EP}")
