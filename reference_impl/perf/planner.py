"""A 3D-parallelism planner: which TP x PP x DP layout (and ZeRO stage, micro-batch size,
activation recomputation) to use for a model on a cluster, with the math written out.

The course notes "Week 15 - Tensor Parallelism and Pipeline Parallelism", 15.5 (the production
slice): "for your hardware (e.g., 8x H100 per node, 16 nodes),
what TP/PP/DP degrees do you choose for a 70B model? Document the math." Its rules (15.2):
TP degree <= GPUs per node (NVLink scope); PP degree from memory; DP fills the rest.

    python -m reference_impl.perf.planner --preset 70b --nodes 16 --gpus-per-node 8 --explain

Every formula is the course's own, reused rather than rewritten:

* model-state bytes per GPU: :func:`reference_impl.hybrid.zero.zero_memory_formula` on the GPU's
  share of the parameters, ``num_params / (tp * pp)``, with ZeRO sharding over the DP degree
  (mixed precision Adam: 16 bytes per parameter before sharding);
* activation bytes: :func:`reference_impl.memory.activation_memory.activation_memory_formula`
  (Korthikanti et al. 2022, Table 2) per layer, times the layers of one stage, times the
  microbatches in flight on the first stage of 1F1B (``min(pp, m)``); under full
  recomputation one layer's activations are rebuilt during its backward, so one layer's
  un-recomputed activations are added as working memory;
* TP all-reduces: :func:`reference_impl.comm.alpha_beta.ring_all_reduce_seconds` on the intra-node
  link (TP stays inside a node);
* the pipeline bubble: :func:`reference_impl.pipeline.pipeline_simulator.bubble_formula` for 1F1B;
* the DP gradient all-reduce: ring over the DP degree on the inter-node link.

The step-time model (stated, not measured; all of it in :func:`evaluate`):

    compute   = 6 * N * tokens / (GPUs * peak * MFU)            (Kaplan et al. 2020: 6 flops
                                                                  per parameter per token)
              * ceil(L/pp) * pp / L         uneven stages: the slowest one sets the pace
              * (1 + 1/3)                   full recomputation (one more forward)
              * (1 + s / (3 (6h + s)))      selective recomputation (the attention scores'
                                            4bs^2h forward flops again; Korthikanti et al.)
    tp_comm   = layers/stage * m * k * ring_all_reduce(b*s*h*2 bytes, tp, intra link)
                k = 4 all-reduces per layer and microbatch (2 forward, 2 backward; 6 under
                full recomputation); with sequence parallelism the all-gather +
                reduce-scatter pair moves the same bytes, so the cost is the same
    slot      = (compute + tp_comm) / m + 2 * (alpha + b*s*h*2 / link)   one microbatch's
                forward + backward on one stage plus its activation send and gradient send
    pipeline  = slot * m / (1 - bubble),  bubble = bubble_formula("1f1b", pp, m) = (p-1)/(m+p-1)
    dp_comm   = ring_all_reduce(2 bytes * N/(tp*pp), dp, inter link)  (ZeRO-1/2: reduce-scatter
                + all-gather, the same bytes; ZeRO-3: x1.5 for the second parameter all-gather)
    step      = pipeline + dp_comm     (no overlap of communication with compute: pessimistic)

Simplifications, said once: grouped-query attention and gated MLPs change the parameter count
(counted exactly from ``kv_heads`` and ``ffn_hidden``) but the activation formula is the
paper's GPT layer (MHA, 4h GeLU MLP); embeddings and the output layer are spread evenly over the
stages (``N / (tp*pp)``) and their activations (the logits) are not counted; memory is in GiB
(2**30 bytes) with a reserve (default 10%) for the CUDA context, NCCL buffers and
fragmentation; bandwidths are per GPU in GB/s (1e9 bytes/s); a pipeline's neighbouring stages
are on different nodes unless the whole model-parallel group (tp*pp GPUs) fits in one node.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace

from reference_impl.memory.activation_memory import activation_memory_formula
from reference_impl.comm.alpha_beta import ring_all_reduce_seconds
from reference_impl.pipeline.pipeline_simulator import bubble_formula
from reference_impl.hybrid.zero import zero_memory_formula

GiB = 2 ** 30
GB = 10 ** 9
RECOMPUTE = (None, "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
MICRO_BATCHES = (1, 2, 4, 8)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: enough to count its parameters and activations."""
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None       # grouped-query attention; None: = heads (MHA)
    ffn_hidden: int | None = None     # None: 4 * hidden
    gated_mlp: bool = False           # SwiGLU: 3 matrices in the MLP instead of 2
    tied_embeddings: bool = False     # output layer shares the embedding matrix

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            _positive(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.kv_heads is not None:
            _positive("kv_heads", self.kv_heads)
        if self.ffn_hidden is not None:
            _positive("ffn_hidden", self.ffn_hidden)

    @property
    def params_per_layer(self) -> int:
        """Attention h(2h + 2 kv_heads * head_dim) + MLP (2 or 3) h * ffn (biases, norms ignored)."""
        h = self.hidden
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        ffn = self.ffn_hidden or 4 * h
        return h * (2 * h + 2 * kv) + (3 if self.gated_mlp else 2) * h * ffn

    @property
    def num_params(self) -> int:
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return self.layers * self.params_per_layer + embeddings


PRESETS = {
    # GPT-3 (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, 96 heads, context 2048.
    "gpt3-175b": ModelSpec("gpt3-175b", 96, 12288, 96, 51200, 2048, tied_embeddings=True),
    # Llama 2 7B (Touvron et al. 2023): 32 layers, 4096, 32 heads, SwiGLU 11008, vocab 32000.
    "7b": ModelSpec("7b", 32, 4096, 32, 32000, 4096, ffn_hidden=11008, gated_mlp=True),
    # Llama 3 70B (Dubey et al. 2024, Table 3): 80 layers, 8192, 64 heads, 8 KV heads,
    # SwiGLU 28672, vocab 128256.
    "70b": ModelSpec("70b", 80, 8192, 64, 128256, 4096, kv_heads=8, ffn_hidden=28672,
                     gated_mlp=True),
    # Llama 3 405B (Table 3): 126 layers, 16384, 128 heads, 8 KV heads, SwiGLU 53248.
    "405b": ModelSpec("405b", 126, 16384, 128, 128256, 8192, kv_heads=8, ffn_hidden=53248,
                      gated_mlp=True),
}


@dataclass(frozen=True)
class Cluster:
    """GPUs per node x nodes; memory in GiB, bandwidths per GPU in GB/s, peak in TFLOP/s."""
    gpus_per_node: int = 8
    nodes: int = 16
    gpu_memory_gib: float = 80.0
    intra_bw_gbs: float = 450.0      # NVLink 4, one direction
    inter_bw_gbs: float = 50.0       # one 400 Gb/s NIC per GPU
    peak_tflops: float = 989.0       # H100 SXM dense BF16
    mfu: float = 0.4
    intra_alpha: float = 5e-6
    inter_alpha: float = 10e-6
    reserve: float = 0.10            # memory kept back for context, buffers, fragmentation

    def __post_init__(self):
        for name in ("gpus_per_node", "nodes", "gpu_memory_gib", "intra_bw_gbs",
                     "inter_bw_gbs", "peak_tflops", "mfu"):
            _positive(name, getattr(self, name))
        if self.mfu > 1:
            raise ValueError(f"mfu must be at most 1, got {self.mfu}")
        if not 0 <= self.reserve < 1:
            raise ValueError(f"reserve must be in [0, 1), got {self.reserve}")
        if self.intra_alpha < 0 or self.inter_alpha < 0:
            raise ValueError(f"latencies must be >= 0, got {self.intra_alpha}, {self.inter_alpha}")

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_bytes(self) -> float:
        return self.gpu_memory_gib * GiB * (1 - self.reserve)


H100_16_NODES = Cluster()


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    zero: int = 1
    micro_batch: int = 1
    recompute: str | None = "selective"
    sequence_parallel: bool = True

    def describe(self) -> str:
        return (f"TP {self.tp} x PP {self.pp} x DP {self.dp}, ZeRO-{self.zero}, "
                f"micro-batch {self.micro_batch}, recompute {self.recompute or 'none'}"
                f"{', SP' if self.sequence_parallel and self.tp > 1 else ''}")


@dataclass(frozen=True)
class Plan:
    """A layout evaluated for one model, cluster and global batch: memory and time terms."""
    model: ModelSpec
    cluster: Cluster
    layout: Layout
    global_batch: int
    microbatches: int
    layers_per_stage: int
    params_per_gpu: float
    model_state_bytes: float
    activation_per_layer_bytes: float
    in_flight: int
    activation_bytes: float
    compute_s: float
    tp_comm_s: float
    p2p_s: float
    bubble: float
    pipeline_s: float
    dp_comm_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def memory_bytes(self) -> float:
        return self.model_state_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.cluster.usable_bytes

    @property
    def step_s(self) -> float:
        return self.pipeline_s + self.dp_comm_s

    @property
    def tokens(self) -> int:
        return self.global_batch * self.model.seq_len

    def row(self) -> str:
        lay = self.layout
        return (f"{lay.tp:>3} {lay.pp:>3} {lay.dp:>4} {lay.zero:>5} {lay.micro_batch:>3} "
                f"{(lay.recompute or 'none'):>9} {self.memory_bytes / GiB:>8.1f} "
                f"{self.bubble:>7.1%} {self.tp_comm_s:>7.2f} {self.dp_comm_s:>7.2f} "
                f"{self.step_s:>8.2f}")


TABLE_HEADER = (" tp  pp   dp  zero  mb recompute  mem GiB  bubble  tp s    dp s    step s")


def get_model(preset: str) -> ModelSpec:
    try:
        return PRESETS[preset.lower()]
    except KeyError:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}") from None


def check_layout(model: ModelSpec, cluster: Cluster, layout: Layout) -> None:
    """The Week 15 notes' rules, and what the model allows; a ValueError names the numbers."""
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    for name in ("tp", "pp", "dp", "micro_batch"):
        value = getattr(layout, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if tp * pp * dp != cluster.num_gpus:
        raise ValueError(f"tp {tp} x pp {pp} x dp {dp} = {tp * pp * dp}, but the cluster has "
                         f"{cluster.nodes} nodes x {cluster.gpus_per_node} = "
                         f"{cluster.num_gpus} GPUs")
    if tp > cluster.gpus_per_node:
        raise ValueError(f"tp {tp} is larger than a node ({cluster.gpus_per_node} GPUs): "
                         f"tensor parallelism must stay on the intra-node links")
    if cluster.gpus_per_node % tp:
        raise ValueError(f"tp {tp} does not divide the {cluster.gpus_per_node} GPUs of a node")
    if model.heads % tp:
        raise ValueError(f"tp {tp} does not divide the {model.heads} attention heads")
    if pp > model.layers:
        raise ValueError(f"pp {pp} is more than the {model.layers} layers")
    if layout.zero not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {layout.zero!r}")
    if layout.recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of none, selective, full, got {layout.recompute!r}")


def evaluate(model: ModelSpec, cluster: Cluster, layout: Layout, global_batch: int) -> Plan:
    """Memory and step time of ``layout`` (formulas in the module docstring)."""
    check_layout(model, cluster, layout)
    _positive("global_batch", global_batch)
    tp, pp, dp, b = layout.tp, layout.pp, layout.dp, layout.micro_batch
    if global_batch % (dp * b):
        raise ValueError(f"global batch {global_batch} is not divisible by dp {dp} x "
                         f"micro-batch {b} = {dp * b}")
    m = global_batch // (dp * b)
    s, h, a, n = model.seq_len, model.hidden, model.heads, model.num_params
    sp = layout.sequence_parallel and tp > 1

    # memory
    params_per_gpu = n / (tp * pp)
    model_state = zero_memory_formula(params_per_gpu, dp, layout.zero)
    layers_per_stage = math.ceil(model.layers / pp)
    per_layer = activation_memory_formula(s, b, h, a, tp, sequence_parallel=sp,
                                          recompute=layout.recompute)
    in_flight = min(pp, m)  # 1F1B, first stage
    activation = per_layer * layers_per_stage * in_flight
    notes = []
    if layout.recompute == "full":  # one layer rebuilt during its backward
        activation += activation_memory_formula(s, b, h, a, tp, sequence_parallel=sp)
        notes.append("full recomputation: + one layer's activations as working memory")

    # time
    peak = cluster.num_gpus * cluster.peak_tflops * 1e12 * cluster.mfu
    compute = 6 * n * global_batch * s / peak
    imbalance = layers_per_stage * pp / model.layers  # the slowest stage has ceil(L/pp) layers
    compute *= imbalance
    if layout.recompute == "full":
        compute *= 1 + 1 / 3
    elif layout.recompute == "selective":
        compute *= 1 + s / (3 * (6 * h + s))
    boundary_bytes = b * s * h * 2
    all_reduces = 6 if layout.recompute == "full" else 4
    intra = cluster.intra_bw_gbs * GB
    inter = cluster.inter_bw_gbs * GB
    tp_comm = layers_per_stage * m * all_reduces * (
        ring_all_reduce_seconds(boundary_bytes, tp, cluster.intra_alpha, intra) if tp > 1 else 0.0)
    if pp > 1:
        same_node = tp * pp <= cluster.gpus_per_node
        alpha, link = (cluster.intra_alpha, intra) if same_node else (cluster.inter_alpha, inter)
        send_bytes = boundary_bytes / tp if sp else boundary_bytes
        p2p = 2 * (alpha + send_bytes / link)
    else:
        p2p = 0.0
    bubble = bubble_formula("1f1b", pp, m)
    slot = (compute + tp_comm) / m + p2p
    pipeline = slot * m / (1 - bubble)
    if dp > 1:
        same_node = tp * pp * dp <= cluster.gpus_per_node
        alpha, link = (cluster.intra_alpha, intra) if same_node else (cluster.inter_alpha, inter)
        dp_comm = ring_all_reduce_seconds(2 * params_per_gpu, dp, alpha, link)
        if layout.zero == 3:
            dp_comm *= 1.5
    else:
        dp_comm = 0.0
    return Plan(model, cluster, layout, global_batch, m, layers_per_stage, params_per_gpu,
                model_state, per_layer, in_flight, activation, compute, tp_comm, p2p * m,
                bubble, pipeline, dp_comm, tuple(notes))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(model: ModelSpec, cluster: Cluster, global_batch: int,
                      tp: int | None = None, pp: int | None = None):
    """Every legal layout: TP dividing a node (and the heads), PP up to the layers, DP the rest."""
    g = cluster.num_gpus
    for t in divisors(cluster.gpus_per_node):
        if model.heads % t or (tp is not None and t != tp):
            continue
        for p in divisors(g // t):
            if p > model.layers or (pp is not None and p != pp):
                continue
            d = g // (t * p)
            for zero in ZERO_STAGES if d > 1 else (0,):
                for b in MICRO_BATCHES:
                    if global_batch % (d * b):
                        continue
                    for recompute in RECOMPUTE:
                        yield Layout(t, p, d, zero, b, recompute)


def plan(model: ModelSpec, cluster: Cluster, global_batch: int, tp: int | None = None,
         pp: int | None = None) -> list[Plan]:
    """The layouts that fit in memory, fastest first (ties: less PP, less ZeRO, less memory)."""
    _positive("global_batch", global_batch)
    if tp is not None and (tp < 1 or cluster.gpus_per_node % tp):
        raise ValueError(f"tp {tp} must divide a node of {cluster.gpus_per_node} GPUs")
    if pp is not None and (pp < 1 or (cluster.num_gpus // (tp or 1)) % pp):
        raise ValueError(f"pp {pp} must divide the {cluster.num_gpus} GPUs / tp {tp or 1}")
    plans = [evaluate(model, cluster, layout, global_batch)
             for layout in candidate_layouts(model, cluster, global_batch, tp, pp)]
    fitting = [p for p in plans if p.fits]
    if not fitting:
        raise ValueError(f"no layout of {model.name} ({model.num_params / 1e9:.1f}B parameters) "
                         f"fits on {cluster.num_gpus} GPUs of {cluster.gpu_memory_gib:g} GiB "
                         f"with global batch {global_batch}")
    return sorted(fitting, key=lambda p: (round(p.step_s, 6), p.layout.pp, p.layout.zero,
                                          p.memory_bytes))


def recommend(model: ModelSpec, cluster: Cluster, global_batch: int) -> Plan:
    """The Week 15 notes' rules, in their order: TP as large as a node allows (the largest
    divisor of the GPUs per node that also divides the heads: TP's per-layer all-reduces stay on
    the fast intra-node links), then the smallest PP for which the model fits ("PP degree
    determined by memory needs"), then DP fills the rest; among those layouts, the fastest by the
    estimate (ZeRO stage, micro-batch, recomputation).

    :func:`plan` ranks every layout by the estimated step time alone; where its fastest has a
    smaller TP, the difference is within what the estimate cannot see (it holds MFU fixed and
    overlaps no communication), which is why the rules, not the estimate, pick the layout.
    """
    tp = max(t for t in divisors(cluster.gpus_per_node) if model.heads % t == 0)
    fitting = plan(model, cluster, global_batch, tp=tp)
    smallest_pp = min(p.layout.pp for p in fitting)
    return next(p for p in fitting if p.layout.pp == smallest_pp)


def explain(plan: Plan) -> str:
    """The math behind ``plan``, term by term, with the numbers filled in."""
    mo, cl, lay = plan.model, plan.cluster, plan.layout
    n, s, h, a, b = mo.num_params, mo.seq_len, mo.hidden, mo.heads, lay.micro_batch
    g = cl.num_gpus
    sp = lay.sequence_parallel and lay.tp > 1
    imbalance = plan.layers_per_stage * lay.pp / mo.layers
    imbalance_note = (f" x {plan.layers_per_stage * lay.pp}/{mo.layers} (uneven stages: the "
                      f"slowest has {plan.layers_per_stage} layers)") if imbalance != 1 else ""
    lines = [
        f"{mo.name}: {mo.layers} layers, hidden {h}, {a} heads"
        f"{f' ({mo.kv_heads} KV heads)' if mo.kv_heads else ''}, vocab {mo.vocab}, seq {s}: "
        f"N = {n / 1e9:.2f}B parameters",
        f"cluster: {cl.nodes} nodes x {cl.gpus_per_node} GPUs = {g}, {cl.gpu_memory_gib:g} GiB "
        f"each ({cl.usable_bytes / GiB:.1f} GiB usable after {cl.reserve:.0%} reserve)",
        f"layout: {lay.describe()}",
        f"rules: tp {lay.tp} <= {cl.gpus_per_node} GPUs per node; tp x pp x dp = {lay.tp} x "
        f"{lay.pp} x {lay.dp} = {g}",
        "",
        "memory per GPU",
        f"  parameters per GPU  N / (tp pp) = {n / 1e9:.2f}B / {lay.tp * lay.pp} = "
        f"{plan.params_per_gpu / 1e9:.3f}B",
        f"  model states        zero_memory_formula(stage {lay.zero}, N_dp = {lay.dp}) = "
        f"{plan.model_state_bytes / GiB:.2f} GiB "
        f"({plan.model_state_bytes / plan.params_per_gpu:.3f} bytes/parameter)",
        f"  activations/layer   activation_memory_formula(s={s}, b={b}, h={h}, a={a}, t={lay.tp}, "
        f"SP={sp}, recompute={lay.recompute}) = {plan.activation_per_layer_bytes / 2**20:.1f} MiB",
        f"  activations         x {plan.layers_per_stage} layers/stage x {plan.in_flight} "
        f"microbatches in flight (1F1B, first stage) = {plan.activation_bytes / GiB:.2f} GiB",
        *(f"                      ({note})" for note in plan.notes),
        f"  total               {plan.memory_bytes / GiB:.2f} GiB of {cl.usable_bytes / GiB:.1f} "
        f"GiB usable: {'fits' if plan.fits else 'does NOT fit'}",
        "",
        f"time per step (global batch {plan.global_batch} x {s} = {plan.tokens / 1e6:.2f}M tokens, "
        f"m = {plan.global_batch} / (dp {lay.dp} x b {b}) = {plan.microbatches} microbatches)",
        f"  compute   6 N tokens / (GPUs x peak x MFU) = 6 x {n:.3g} x {plan.tokens:.3g} / "
        f"({g} x {cl.peak_tflops:g}e12 x {cl.mfu:g})"
        f"{' x 4/3 (full recompute)' if lay.recompute == 'full' else ''}"
        f"{' x (1 + s/(3(6h+s))) (selective recompute)' if lay.recompute == 'selective' else ''}"
        f"{imbalance_note}"
        f" = {plan.compute_s:.2f} s",
        f"  TP comm   {plan.layers_per_stage} layers x {plan.microbatches} mb x "
        f"{6 if lay.recompute == 'full' else 4} all-reduces of b s h 2 = "
        f"{b * s * h * 2 / 2**20:.0f} MiB over {lay.tp} GPUs at {cl.intra_bw_gbs:g} GB/s = "
        f"{plan.tp_comm_s:.2f} s",
        f"  PP sends  {plan.microbatches} mb x 2 sends = {plan.p2p_s:.2f} s; bubble "
        f"bubble_formula('1f1b', p={lay.pp}, m={plan.microbatches}) = (p-1)/(m+p-1) = "
        f"{plan.bubble:.2%}",
        f"  pipeline  (compute + TP comm + PP sends) / (1 - bubble) = {plan.pipeline_s:.2f} s",
        f"  DP comm   ring all-reduce of 2 x {plan.params_per_gpu / 1e9:.3f}B bytes of gradients "
        f"over {lay.dp} GPUs at {cl.inter_bw_gbs:g} GB/s"
        f"{' x 1.5 (ZeRO-3)' if lay.zero == 3 else ''} = {plan.dp_comm_s:.2f} s",
        f"  step      {plan.step_s:.2f} s ({plan.tokens / plan.step_s / g:,.0f} tokens/s/GPU)",
    ]
    return "\n".join(lines)


def table(plans: list[Plan]) -> str:
    return "\n".join([TABLE_HEADER, *(p.row() for p in plans)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.perf.planner",
        description="Rank TP x PP x DP layouts for a model on a cluster by estimated step time.")
    parser.add_argument("--preset", default="70b", help=f"model: {', '.join(PRESETS)}")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU")
    parser.add_argument("--intra-bw", type=float, default=450.0, help="GB/s per GPU, in a node")
    parser.add_argument("--inter-bw", type=float, default=50.0, help="GB/s per GPU, across nodes")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--mfu", type=float, default=0.4)
    parser.add_argument("--seq", type=int, help="sequence length (default: the preset's)")
    parser.add_argument("--global-batch", type=int, default=1024, help="sequences per step")
    parser.add_argument("--tp", type=int, help="fix the TP degree")
    parser.add_argument("--pp", type=int, help="fix the PP degree")
    parser.add_argument("--top", type=int, default=5, help="rows of the ranked table")
    parser.add_argument("--explain", action="store_true", help="show the math of the best plan")
    args = parser.parse_args(argv)
    try:
        model = get_model(args.preset)
        if args.seq is not None:
            _positive("seq", args.seq)
            model = replace(model, seq_len=args.seq)
        _positive("top", args.top)
        cluster = Cluster(args.gpus_per_node, args.nodes, args.gpu_memory, args.intra_bw,
                          args.inter_bw, args.peak_tflops, args.mfu)
        plans = plan(model, cluster, args.global_batch, args.tp, args.pp)
    except ValueError as error:
        parser.error(str(error))
    print(f"{len(plans)} layouts fit; the {min(args.top, len(plans))} fastest by the estimate:")
    print(table(plans[:args.top]))
    chosen = plans[0] if args.tp or args.pp else recommend(model, cluster, args.global_batch)
    if not (args.tp or args.pp):
        print("\nrecommended by the Week 15 notes' rules "
              "(TP inside a node, PP from memory, DP the rest):")
        print(table([chosen]))
    if args.explain:
        print()
        print(explain(chosen))


if __name__ == "__main__":
    main()
