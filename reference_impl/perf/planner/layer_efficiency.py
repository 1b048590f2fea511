"""How fast one transformer layer runs on one GPU, from the shapes one TP rank holds.

A fixed "MFU" cannot rank layouts: narrower matrices and smaller micro-batches reach less of the
peak. The model is five numbers (``e_gemm``, ``F0``, ``e_attention``, ``elementwise``,
``launch_floor``) fitted to a calibration table (``calibrate.py``;
``data/h100_layer_efficiency.json``), explicit attention adding 34 bytes per score element at
the memory bandwidth. The formula and the measurements behind it: docs/library.md, 'The
planner's model, term by term'.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from reference_impl.perf.planner.model_spec import ModelSpec

DATA = Path(__file__).with_name("data")
H100_TABLE = DATA / "h100_layer_efficiency.json"
EXPLICIT_SCORE_BYTES = 34  # per score element, forward + backward (docs/library.md)
ATTENTION_KERNELS = ("flash", "explicit")

# The shapes the calibration table is measured at (its README): llama-7b (Touvron et al. 2023),
# llama3-70b (Dubey et al. 2024) and a GPT-3 175B-wide layer with a SwiGLU MLP of 49152 (the
# table's FLOP count, 16 h^2 per layer, is that of three h x 49152 matrices).
CALIBRATION_SHAPES = {
    "llama-7b": ModelSpec("llama-7b", 1, 4096, 32, 32000, 2048, ffn_hidden=11008,
                          gated_mlp=True),
    "llama3-70b": ModelSpec("llama3-70b", 1, 8192, 64, 128256, 2048, kv_heads=8,
                            ffn_hidden=28672, gated_mlp=True),
    "gpt3-175b": ModelSpec("gpt3-175b", 1, 12288, 96, 51200, 2048, ffn_hidden=49152,
                           gated_mlp=True),
}


@dataclass(frozen=True)
class LayerEfficiency:
    """One GPU's layer-time model (docs/library.md); peak in FLOP/s, bandwidth in bytes/s."""
    device: str
    peak_flops: float
    memory_bandwidth: float
    e_gemm: float
    gemm_fixed_flops: float
    e_attention: float
    elementwise_s: float
    launch_floor_s: float
    source: str = ""

    def gemm_seconds(self, flops: float) -> float:
        return (flops + self.gemm_fixed_flops) / (self.peak_flops * self.e_gemm)

    def attention_seconds(self, b: int, s_query: int, s_key: int, heads_local: int,
                          head_dim: int, kernel: str = "flash") -> float:
        """QK^T and AV of ``heads_local`` heads, forward + backward, causal."""
        if kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention kernel must be one of {ATTENTION_KERNELS}, got {kernel!r}")
        full = 12 * b * s_query * s_key * heads_local * head_dim
        if kernel == "flash":
            return full / 2 / (self.peak_flops * self.e_attention)
        scores = b * heads_local * s_query * s_key
        return (full / (self.peak_flops * self.e_gemm)
                + EXPLICIT_SCORE_BYTES * scores / self.memory_bandwidth)

    def layer_seconds(self, model: ModelSpec, tp: int, micro_batch: int, cp: int = 1,
                      attention: str = "flash") -> float:
        """One layer's forward + backward on one rank of a TP x CP group, no recomputation.
        CP splits the sequence: each rank's queries are s/cp tokens against all s keys."""
        s = model.seq_len
        tokens = micro_batch * s // cp
        gemms = self.layer_gemm_seconds(model, tp, micro_batch, cp)
        attention_s = self.attention_seconds(micro_batch, s // cp, s, model.heads // tp,
                                             model.hidden // model.heads, attention)
        elementwise = self.elementwise_s * tokens * model.hidden
        return max(self.launch_floor_s, gemms + attention_s + elementwise)

    def layer_gemm_seconds(self, model: ModelSpec, tp: int, micro_batch: int,
                           cp: int = 1) -> float:
        """The weight GEMMs of one layer on one TP x CP rank, forward + backward."""
        tokens = micro_batch * model.seq_len // cp
        return sum(self.gemm_seconds(6 * tokens * k * n) for k, n in model.layer_gemms(tp))

    def gemm_only_seconds(self, tokens: int, k: int, n: int) -> float:
        """A lone GEMM (the LM head): forward + backward."""
        return self.gemm_seconds(6 * tokens * k * n)

    def for_device(self, device: str, peak_flops: float, memory_bandwidth: float,
                   e_gemm: float, source: str) -> "LayerEfficiency":
        """The same shape model on another GPU: the fixed GEMM cost and the launch floor kept
        in seconds, the elementwise term scaled by memory bandwidth, attention by the same
        ratio as the GEMM ceiling, and the ceiling ``e_gemm`` given."""
        return replace(self, device=device, peak_flops=peak_flops,
                       memory_bandwidth=memory_bandwidth, e_gemm=e_gemm,
                       gemm_fixed_flops=self.gemm_fixed_flops * peak_flops / self.peak_flops
                       * e_gemm / self.e_gemm,
                       e_attention=self.e_attention * e_gemm / self.e_gemm,
                       elementwise_s=self.elementwise_s * self.memory_bandwidth
                       / memory_bandwidth, source=source)


# ------------------------------------------------------------------ fitting a calibration table

def _parameters_to_model(x, device, peak, bandwidth, source) -> LayerEfficiency:
    e_gemm, fixed, e_attention, elementwise, floor = (math.exp(v) for v in x)
    return LayerEfficiency(device, peak, bandwidth, e_gemm, fixed, e_attention,
                           elementwise * 1e-12, floor, source)


def _nelder_mead(f, x0: list[float], step: float = 0.5, iterations: int = 800,
                 tolerance: float = 1e-12) -> list[float]:
    """Nelder and Mead's simplex method (1965), reflection/expansion/contraction/shrink."""
    n = len(x0)
    simplex = [list(x0)] + [[v + (step if i == j else 0) for j, v in enumerate(x0)]
                            for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tolerance:
            break
        centre = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centre, worst)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centre, worst)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [[b + 0.5 * (v - b) for b, v in zip(best, p)] for p in simplex]
                values = [f(p) for p in simplex]
    return simplex[min(range(n + 1), key=values.__getitem__)]


def row_shape(row: dict, shapes: dict | None = None) -> ModelSpec:
    shapes = CALIBRATION_SHAPES if shapes is None else shapes
    try:
        shape = shapes[row["model"]]
    except KeyError:
        raise ValueError(f"calibration row names shape {row['model']!r}; known: "
                         f"{', '.join(shapes)}") from None
    return replace(shape, seq_len=row["seq"])


def fit(table: dict, memory_bandwidth: float, source: str = "",
        shapes: dict | None = None) -> LayerEfficiency:
    """The five numbers that best fit ``table`` (rows of model, seq, mb, tp, ms), least squares
    on log(predicted / measured) time."""
    rows = table["rows"]
    if len(rows) < 5:
        raise ValueError(f"a calibration table needs at least 5 rows to fit 5 numbers, got {len(rows)}")
    peak = float(table["peak"])
    measured_rows = [(row_shape(r, shapes), r["tp"], r["mb"], r["ms"] * 1e-3) for r in rows]

    def loss(x):
        model = _parameters_to_model(x, "", peak, memory_bandwidth, "")
        return sum(math.log(model.layer_seconds(m, t, b) / measured) ** 2
                   for m, t, b, measured in measured_rows) / len(measured_rows)

    x0 = [math.log(0.7), math.log(1e10 * peak / 989e12), math.log(0.4), math.log(1.0),
          math.log(1e-3)]
    best = _nelder_mead(loss, x0)
    return _parameters_to_model(best, table.get("device", "unknown"), peak, memory_bandwidth,
                                source)


def fit_errors(model: LayerEfficiency, table: dict, shapes: dict | None = None) -> list[float]:
    """predicted / measured - 1 for each row of ``table``."""
    return [model.layer_seconds(row_shape(r, shapes), r["tp"], r["mb"]) / (r["ms"] * 1e-3) - 1
            for r in table["rows"]]


def load_table(path: str | Path) -> dict:
    table = json.loads(Path(path).read_text())
    for key in ("peak", "rows"):
        if key not in table:
            raise ValueError(f"{path}: a calibration table needs '{key}'")
    return table


def describe(model: LayerEfficiency) -> str:
    values = asdict(model)
    return (f"{values['device']}: e_gemm {model.e_gemm:.3f}, F0 {model.gemm_fixed_flops:.3g} "
            f"flops, e_attention {model.e_attention:.3f}, elementwise "
            f"{model.elementwise_s * 1e12:.2f} ps per token x hidden, launch floor "
            f"{model.launch_floor_s * 1e3:.2f} ms")
