"""What autocast adds to a layer's time: fp32 weights and residual stream around bf16 matmuls.

The layer model is fitted to bf16 layers; the kit's trainer casts each fp32 weight and its
gradient (12 bytes per weight counted) and keeps the residual stream and norms in fp32 (about
58 bytes per token and hidden element counted). :data:`PARAMETER_BYTES` and
:data:`ACTIVATION_BYTES` are fitted to the same block timed both ways on an H200
(``data/h200_autocast_layers.json``). The count: docs/library.md, 'The planner's model, term by
term'.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from reference_impl.perf.planner.model_spec import ModelSpec

AUTOCAST_TABLE = Path(__file__).with_name("data") / "h200_autocast_layers.json"
PARAMETER_BYTES = 16.8    # per weight of the layer, per step (12 counted)
ACTIVATION_BYTES = 130.0  # per token and hidden element, per step (about 58 counted)


def autocast_seconds(model: ModelSpec, memory_bandwidth: float, tp: int, micro_batch: int,
                     cp: int = 1) -> float:
    """Seconds autocast adds to one layer's forward + backward on one TP x CP rank."""
    weights = sum(k * n for k, n in model.layer_gemms(tp))
    tokens = micro_batch * model.seq_len // cp
    return (PARAMETER_BYTES * weights + ACTIVATION_BYTES * tokens * model.hidden) \
        / memory_bandwidth


def fit_autocast_bytes(table: dict) -> tuple[float, float]:
    """(bytes per weight, bytes per token and hidden element) that best explain the time
    autocast adds in ``table`` (each shape timed as "autocast" and as "bf16"); least squares
    on the relative error."""
    rows = {(r["kind"], r["hidden"], r["batch"], r["precision"]): r for r in table["rows"]}
    design, extra = [], []
    for (kind, hidden, batch, precision), row in rows.items():
        if precision != "autocast" or kind != "gpt":
            continue
        added = (row["ms"] - rows[(kind, hidden, batch, "bf16")]["ms"]) * 1e-3
        scale = table["memory_bandwidth"] * added
        design.append([row["params"] / scale, batch * row["seq"] * hidden / scale])
        extra.append(1.0)
    solution = torch.linalg.lstsq(torch.tensor(design, dtype=torch.float64),
                                  torch.tensor(extra, dtype=torch.float64)[:, None]).solution
    return float(solution[0, 0]), float(solution[1, 0])


def load_autocast_table(path: str | Path = AUTOCAST_TABLE) -> dict:
    return json.loads(Path(path).read_text())
