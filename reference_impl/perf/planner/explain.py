"""The math behind a plan, term by term, with the numbers filled in; why the recommended plan
beats the runner-up; the layouts public recipes use, evaluated beside it (``practice.py``); how
the answer moves with the global batch and with TP communication overlapped; and how far to
trust it (the validation table's error on the same GPU)."""
from __future__ import annotations

from dataclasses import replace

from reference_impl.perf.planner.hardware import GiB, Cluster, outside_allocator_bytes
from reference_impl.perf.planner.model_spec import ModelSpec
from reference_impl.perf.planner.plans import Plan, evaluate, plan, recommend
from reference_impl.perf.planner.practice import practice_plans
from reference_impl.perf.planner.published_runs import PUBLISHED_RUNS
from reference_impl.perf.planner.validation import compare, summary

TERMS = ("layers", "recompute", "TP", "CP", "LM head", "bubble", "framework", "sends", "DP",
         "optimizer")


def explain(plan: Plan) -> str:
    mo, cl, lay, mem, t = plan.model, plan.cluster, plan.layout, plan.memory, plan.time
    eff, terms = cl.gpu.layer, cl.terms
    tp_note = ("not overlapped" if not lay.tp_comm_overlap else
               "overlapped, at tp_comm_overlap's bound" if terms.tp_overlap_bound else
               f"overlapped in {lay.tp} chunks, one exposed, the GEMMs losing "
               f"{terms.sm_share:.0%} of the SMs meanwhile")
    stage = (f"{t.stage_layers} layers{' + the LM head' if t.stage_has_head else ''}"
             f"{' (the last stage)' if t.stage_has_head and lay.pp > 1 else ''}")
    causes = ", ".join(f"{name} {seconds:.2f}" for name, seconds in t.breakdown().items()
                       if seconds > 0.005)
    lines = [
        f"{mo.name}: {mo.layers} layers, hidden {mo.hidden}, {mo.heads} heads"
        f"{f' ({mo.kv_heads} KV heads)' if mo.kv_heads else ''}, vocab {mo.vocab}, seq "
        f"{mo.seq_len}: N = {mo.num_params / 1e9:.2f}B parameters"
        + (f" ({mo.experts} experts of MLP {mo.ffn}, top-{mo.top_k}: {mo.active_params / 1e9:.2f}B"
           f" active, their all-to-all {t.ep_exposed_s * 1e3:.2f} ms per layer and microbatch)"
           if mo.experts else ""),
        f"cluster: {cl.nodes} nodes x {cl.gpus_per_node} {cl.gpu.name} = {cl.num_gpus} GPUs "
        f"({cl.usable_bytes / GiB:.1f} GiB usable: {outside_allocator_bytes() / GiB:.1f} GiB "
        f"for the CUDA context and NCCL{f', {cl.reserve:.0%} reserve' if cl.reserve else ''})",
        f"layout: {lay.describe()}",
        "",
        f"memory per GPU (the {mem.stage} pipeline stage)",
        f"  parameters         {mem.params_per_gpu / 1e9:.3f}B ({mem.layers_per_stage} layers / "
        f"tp {lay.tp}, embedding on the first stage, LM head on the last)",
        f"  model states       {lay.accounting} accounting, ZeRO-{lay.zero} over dp x cp = "
        f"{lay.dp * lay.cp}: {mem.model_state_bytes / GiB:.2f} GiB "
        f"({mem.model_state_bytes / mem.params_per_gpu:.2f} bytes/parameter)",
        f"  activations/layer  activation_bytes(s={mo.seq_len // lay.cp}, "
        f"b={lay.micro_batch}, t={lay.tp}, recompute={lay.recompute}, attention={lay.attention}:"
        f" MLP {mo.ffn}{' gated' if mo.gated_mlp else ''}, {mo.kv_heads or mo.heads} KV heads)"
        f" = {mem.activation_per_layer_bytes / 2**20:.1f} MiB",
        f"  activations        x {mem.layers_per_stage} layers x {mem.in_flight:.2f} microbatches "
        f"in flight = {mem.activation_bytes / GiB:.2f} GiB (+ {mem.fragmentation_bytes / GiB:.2f}"
        f" GiB fragmentation)",
        f"  logits             {'12' if lay.accounting == 'fsdp' else '4'} s b V / t = "
        f"{mem.logits_bytes / GiB:.2f} GiB (the loss's peak), stranded by the allocator "
        f"{mem.allocator_bytes / GiB:.2f} GiB; a layer rebuilt {mem.rebuilt_bytes / GiB:.2f} GiB;"
        f" the larger counts",
        f"  total              {plan.memory_bytes / GiB:.2f} GiB reserved "
        f"({mem.allocated_bytes / GiB:.2f} GiB allocated): "
        f"{'fits' if plan.fits else 'does NOT fit'}",
        "",
        f"time per step ({plan.global_batch} x {mo.seq_len} = {plan.tokens / 1e6:.2f}M tokens, "
        f"m = {t.microbatches} microbatches per pipeline)",
        f"  one layer          {t.layer_s * 1e3:.2f} ms fwd+bwd on {eff.device} "
        f"({eff.source}), at {terms.clock:.0%} of its benchmark clock under load; "
        f"recompute +{t.recompute_s * 1e3:.2f} ms",
        f"  TP                 {t.tp_comm_s * 1e3:.2f} ms per layer (ring collectives on NVLink, "
        f"{tp_note}): {t.tp_exposed_s * 1e3:.2f} ms exposed; CP exposed "
        f"{t.cp_exposed_s * 1e3:.2f} ms",
        f"  LM head            {t.head_s * 1e3:.2f} ms per microbatch on the last stage",
        f"  slowest stage      {stage}: {t.stage_s * 1e3:.1f} ms per microbatch",
        f"  pipeline           makespan_formula({'interleaved' if lay.v > 1 else '1f1b'}, "
        f"p={lay.pp}, m={t.microbatches}, v={lay.v}) = {t.pipeline_s:.2f} s "
        f"(bubble {t.bubble:.1%})",
        f"  framework          {t.framework_s:.3f} s ({terms.overhead_s(lay.accounting) * 1e3:.1f} "
        f"ms per forward or backward of a model chunk, {lay.accounting})",
        f"  sends              {t.sends_s:.3f} s exposed (warm-up and cool-down)",
        f"  DP                 {t.dp_s:.3f} s exposed after overlap with the backward (two "
        f"levels, ring or tree over the nodes, in buckets; with the SMs it takes)",
        f"  optimizer          {t.optimizer_s:.3f} s",
        f"  step               {plan.step_s:.2f} s: {plan.tokens_per_gpu_s:,.0f} tokens/s/GPU, "
        f"{plan.model_tflops_per_gpu:.0f} TFLOP/s/GPU, MFU {plan.mfu:.1%}",
        f"  by cause (s)       {causes}",
    ]
    return "\n".join(lines)


def differences(plan: Plan, reference: Plan, count: int = 3) -> str:
    """The terms that make ``plan`` slower (or faster) than ``reference``, largest first."""
    mine, theirs = plan.time.breakdown(), reference.time.breakdown()
    deltas = sorted(((mine[k] - theirs[k], k) for k in TERMS), key=lambda d: -abs(d[0]))
    return ", ".join(f"{name} {delta:+.2f} s" for delta, name in deltas[:count]
                     if abs(delta) >= 0.005)


def why(best: Plan, runner_up: Plan) -> str:
    """The recommended plan against the runner-up, term by term (seconds per step)."""
    a, b = best.time.breakdown(), runner_up.time.breakdown()
    lines = [f"recommended: {best.layout.describe()}",
             f"runner-up:   {runner_up.layout.describe()} "
             f"({runner_up.step_s / best.step_s - 1:+.1%} step time; the fastest with "
             f"another TP x PP)",
             f"{'seconds per step':<22}{'recommended':>12}{'runner-up':>12}"]
    lines += [f"{name:<22}{a[name]:>12.2f}{b[name]:>12.2f}" for name in TERMS
              if a[name] or b[name]]
    lines += [f"{'step':<22}{best.step_s:>12.2f}{runner_up.step_s:>12.2f}",
              f"{'memory GiB':<22}{best.memory_bytes / GiB:>12.1f}"
              f"{runner_up.memory_bytes / GiB:>12.1f}",
              f"why: the runner-up differs by {differences(runner_up, best)}"]
    return "\n".join(lines)


def practice_comparison(best: Plan, tp_comm_overlap: bool = False) -> str:
    """Public recipes' layouts for this model on the same cluster and batch, beside the pick;
    'TP overlap' is each with its TP collectives overlapped (tp_comm_overlap)."""
    model, cluster, batch = best.model, best.cluster, best.global_batch
    rows = practice_plans(model, cluster, batch, tp_comm_overlap)
    if not rows:
        return f"practice: no public recipe stored for {model.name} (practice.py)"
    hidden = dict((recipe.name, p) for recipe, p in practice_plans(model, cluster, batch, True))
    best_hidden = _with_tp_hidden(best)
    lines = [f"practice: public recipes' layouts on the same {cluster.num_gpus} GPUs and "
             f"batch (DP fills the rest), evaluated by the same estimate",
             f"  {'layout':<30}{'GiB':>6}{'step s':>8}{'vs pick':>9}{'MFU':>7}{'TP s':>7}"
             f"{'bubble s':>9}{'TP overlap':>11}  recipe"]

    def row(p: Plan, hidden_s: float, name: str) -> str:
        terms = p.time.breakdown()
        return (f"  {p.layout.short():<30}{p.memory_bytes / GiB:>6.1f}{p.step_s:>8.2f}"
                f"{p.step_s / best.step_s - 1:>+9.1%}{p.mfu:>7.1%}{terms['TP']:>7.2f}"
                f"{terms['bubble']:>9.2f}{hidden_s:>11.2f}  {name}"
                f"{'' if p.fits else ' (over memory)'}")

    lines.append(row(best, best_hidden.step_s, "the planner's pick"))
    notes = []
    for recipe, p in rows:
        if isinstance(p, str):
            lines.append(f"  {recipe.name}: cannot run here: {p}")
            continue
        lines.append(row(p, hidden[recipe.name].step_s, recipe.name))
        notes.append(f"  {recipe.name} ({recipe.source}): {differences(p, best)}")
    lines += ["against the pick, the terms that differ most:", *notes,
              "  TP overlap: the layout's TP collectives overlapped with its GEMMs, as "
              "Megatron-Core's tp_comm_overlap runs them (NeMo's recipes turn it on; "
              "--tp-comm-overlap; --best-case for the bound)",
              "  NeMo's published throughputs are FP8 (--validate lists them, unscored); this "
              "estimate is bf16"]
    return "\n".join(lines)


def _with_tp_hidden(p: Plan) -> Plan:
    return evaluate(p.model, p.cluster, replace(p.layout, tp_comm_overlap=True), p.global_batch)


def overlapped(model: ModelSpec, cluster: Cluster, global_batch: int,
               accounting: str = "megatron") -> str:
    """The recommendation if every layout overlapped its TP collectives (tp_comm_overlap)."""
    best, runner_up = recommend(model, cluster, global_batch, accounting, tp_comm_overlap=True)
    return (f"with TP communication overlapped with the GEMMs (--tp-comm-overlap):\n"
            f"  pick       {best.layout.short():<30}{best.step_s:>8.2f} s  MFU {best.mfu:.1%}\n"
            f"  runner-up  {runner_up.layout.short():<30}{runner_up.step_s:>8.2f} s  "
            f"MFU {runner_up.mfu:.1%}")


def batch_sensitivity(model: ModelSpec, cluster: Cluster, batches: list[int],
                      accounting: str = "megatron", tp_comm_overlap: bool = False) -> str:
    """The pick at each global batch, and each practice layout's gap to it."""
    names = [recipe.name for recipe, _ in practice_plans(model, cluster, batches[0])]
    lines = [f"global batch: the pick as the batch shrinks (sequences of {model.seq_len}), and "
             f"each recipe's step time against it",
             f"  {'batch':>12}  {'pick':<30}{'step s':>8}{'MFU':>7}{'bubble':>8}"
             + "".join(f"{name:>18}" for name in names)]
    for batch in batches:
        try:
            best = plan(model, cluster, batch, accounting=accounting,
                        tp_comm_overlap=tp_comm_overlap)[0]
        except ValueError as error:
            lines.append(f"  {batch:>12}  {error}")
            continue
        gaps = []
        for _, p in practice_plans(model, cluster, batch, tp_comm_overlap):
            gaps.append("-" if isinstance(p, str) else
                        f"{p.step_s / best.step_s - 1:+.1%}" + ("" if p.fits else " (mem)"))
        lines.append(f"  {batch:>5} ({best.tokens / 1e6:.2f}M)  {best.layout.short():<30}"
                     f"{best.step_s:>8.2f}{best.mfu:>7.1%}{best.time.bubble:>8.1%}"
                     + "".join(f"{gap:>18}" for gap in gaps))
    return "\n".join(lines)


def trust(gpu_name: str) -> str:
    """How far the estimate is off on this GPU, from the validation table."""
    comparisons = compare([run for run in PUBLISHED_RUNS if not run.not_predicted])
    median, largest = summary(comparisons)
    same_gpu = [c for c in comparisons if c.plan.cluster.gpu.name == gpu_name]
    errors = ", ".join(f"{c.run.name} {c.error:+.1%}" for c in same_gpu)
    lines = [f"trust: predicted against published runs (--validate), median |error| "
             f"{median:.1%}, largest {largest:.1%}"]
    if same_gpu:
        mean = sum(c.error for c in same_gpu) / len(same_gpu)
        lines.append(f"  on the {gpu_name}: {errors}: read step times as "
                     f"{'optimistic' if mean > 0 else 'pessimistic'} by about {abs(mean):.0%} "
                     f"on this GPU")
    lines.append("  a bias shared by every layout leaves the ranking as it is; layouts within "
                 "a few percent of each other are ties")
    return "\n".join(lines)


def full_explanation(model: ModelSpec, cluster: Cluster, global_batch: int,
                     accounting: str = "megatron", tp_comm_overlap: bool = False) -> str:
    """Everything ``--explain`` prints after the ranked table."""
    best, runner_up = recommend(model, cluster, global_batch, accounting, tp_comm_overlap)
    batches = [global_batch // 2 ** k for k in range(6) if global_batch % 2 ** k == 0]
    parts = [explain(best), why(best, runner_up), practice_comparison(best, tp_comm_overlap)]
    if not tp_comm_overlap:
        parts.append(overlapped(model, cluster, global_batch, accounting))
    parts += [batch_sensitivity(model, cluster, batches, accounting, tp_comm_overlap),
              trust(cluster.gpu.name)]
    return "\n\n".join(parts)
