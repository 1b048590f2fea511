"""What autocast adds to a layer's time: fp32 weights and residual stream around bf16 matmuls.

The layer model (``layer_efficiency.py``) is fitted to layers stored and computed in bf16, as
Megatron-LM and FSDP's mixed precision run them. The kit's trainer keeps fp32 weights and an
fp32 residual stream and computes under ``torch.autocast`` (``precision.py``), which moves
more bytes each step:

* per weight: a cast to bf16 in the forward (read 4, write 2 bytes) and the weight
  gradient's cast back to fp32 in the backward (read 2, write 4): 12 bytes counted;
* per token and hidden element: the layernorms read and write fp32 and their outputs are
  cast for the next matmul, the residual adds read an fp32 and a bf16 tensor and write fp32,
  and the backward does the same for the gradients: about 58 bytes counted.

The casting kernels run below the memory bandwidth, so the two costs are fitted, in bytes
at the bandwidth, to the same block timed both ways (``data/h200_autocast_layers.json``:
``reference_impl.model.Block``, GPT parts, hidden 1024-4096, micro-batch 1-8, on one H200):
:data:`PARAMETER_BYTES` and :data:`ACTIVATION_BYTES`, refitted by
``tests/library/planner/test_planner_autocast.py``.
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
