"""The math behind a plan, term by term, with the numbers filled in; and why the recommended
plan beats the runner-up."""
from __future__ import annotations

from reference_impl.perf.planner.hardware import GiB
from reference_impl.perf.planner.plans import Plan


def explain(plan: Plan) -> str:
    mo, cl, lay, mem, t = plan.model, plan.cluster, plan.layout, plan.memory, plan.time
    eff = cl.gpu.layer
    lines = [
        f"{mo.name}: {mo.layers} layers, hidden {mo.hidden}, {mo.heads} heads"
        f"{f' ({mo.kv_heads} KV heads)' if mo.kv_heads else ''}, vocab {mo.vocab}, seq "
        f"{mo.seq_len}: N = {mo.num_params / 1e9:.2f}B parameters",
        f"cluster: {cl.nodes} nodes x {cl.gpus_per_node} {cl.gpu.name} = {cl.num_gpus} GPUs "
        f"({cl.usable_bytes / GiB:.1f} GiB usable after {cl.reserve:.0%} reserve)",
        f"layout: {lay.describe()}",
        "",
        f"memory per GPU (the {mem.stage} pipeline stage)",
        f"  parameters         {mem.params_per_gpu / 1e9:.3f}B ({mem.layers_per_stage} layers / "
        f"tp {lay.tp}, embedding on the first stage, LM head on the last)",
        f"  model states       {lay.accounting} accounting, ZeRO-{lay.zero} over dp x cp = "
        f"{lay.dp * lay.cp}: {mem.model_state_bytes / GiB:.2f} GiB "
        f"({mem.model_state_bytes / mem.params_per_gpu:.2f} bytes/parameter)",
        f"  activations/layer  activation_memory_formula(s={mo.seq_len // lay.cp}, "
        f"b={lay.micro_batch}, t={lay.tp}, recompute={lay.recompute}, attention={lay.attention})"
        f" = {mem.activation_per_layer_bytes / 2**20:.1f} MiB",
        f"  activations        x {mem.layers_per_stage} layers x {mem.in_flight:.2f} microbatches "
        f"in flight = {mem.activation_bytes / GiB:.2f} GiB",
        f"  logits             4 s b V / t = {mem.logits_bytes / GiB:.2f} GiB",
        f"  total              {plan.memory_bytes / GiB:.2f} GiB: "
        f"{'fits' if plan.fits else 'does NOT fit'}",
        "",
        f"time per step ({plan.global_batch} x {mo.seq_len} = {plan.tokens / 1e6:.2f}M tokens, "
        f"m = {t.microbatches} microbatches per pipeline)",
        f"  one layer          {t.layer_s * 1e3:.2f} ms fwd+bwd on {eff.device} "
        f"({eff.source}); recompute +{t.recompute_s * 1e3:.2f} ms",
        f"  TP                 {t.tp_comm_s * 1e3:.2f} ms per layer (ring all-reduces on NVLink, "
        f"not overlapped); CP exposed {t.cp_exposed_s * 1e3:.2f} ms",
        f"  LM head            {t.head_s * 1e3:.2f} ms per microbatch on the last stage",
        f"  stage slot         {t.stage_s * 1e3:.1f} ms per microbatch",
        f"  pipeline           makespan_formula({'interleaved' if lay.v > 1 else '1f1b'}, "
        f"p={lay.pp}, m={t.microbatches}, v={lay.v}) = {t.pipeline_s:.2f} s "
        f"(bubble {t.bubble:.1%})",
        f"  sends              {t.sends_s:.3f} s exposed (warm-up and cool-down)",
        f"  DP                 {t.dp_s:.3f} s exposed after overlap with the backward",
        f"  optimizer          {t.optimizer_s:.3f} s",
        f"  step               {plan.step_s:.2f} s: {plan.tokens_per_gpu_s:,.0f} tokens/s/GPU, "
        f"{plan.model_tflops_per_gpu:.0f} TFLOP/s/GPU, MFU {plan.mfu:.1%}",
    ]
    return "\n".join(lines)


def why(best: Plan, runner_up: Plan) -> str:
    """The recommended plan against the runner-up, term by term."""
    a, b = best.time, runner_up.time
    rows = [("step", best.step_s, runner_up.step_s),
            ("pipeline", a.pipeline_s, b.pipeline_s),
            ("  of which bubble", a.pipeline_s * a.bubble, b.pipeline_s * b.bubble),
            ("layer fwd+bwd (ms)", a.layer_s * 1e3, b.layer_s * 1e3),
            ("TP per layer (ms)", a.tp_comm_s * 1e3, b.tp_comm_s * 1e3),
            ("DP exposed", a.dp_s, b.dp_s),
            ("memory GiB", best.memory_bytes / GiB, runner_up.memory_bytes / GiB)]
    lines = [f"recommended: {best.layout.describe()}",
             f"runner-up:   {runner_up.layout.describe()} "
             f"({runner_up.step_s / best.step_s - 1:+.1%} step time)",
             f"{'':<22}{'recommended':>12}{'runner-up':>12}"]
    lines += [f"{name:<22}{x:>12.2f}{y:>12.2f}" for name, x, y in rows]
    return "\n".join(lines)
