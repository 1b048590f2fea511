"""A training run's log: one JSON object a line (JSON Lines), written as the run goes, so a
run stopped half-way still has its curve, and any tool (pandas, jq, a notebook) reads it.

Each line is a step's record, ``{"step", "loss", "grad_norm", "lr", "tokens_per_s",
"elapsed_s"}``, or an evaluation's, ``{"step", "val_loss"}``.
"""
from __future__ import annotations

import json
import math
import os


class RunLog:
    """Writes records to ``directory/log.jsonl`` and keeps them for the loss curve. A run
    resumed at step ``after`` keeps the file's records up to it and drops the later ones (a
    longer run's, whose checkpoint was older)."""

    FILE = "log.jsonl"

    def __init__(self, directory: str, after: int = 0):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, self.FILE)
        self.records = [record for record in read_log(self.path) if record["step"] <= after]
        with open(self.path, "w", encoding="utf-8") as file:
            file.writelines(json.dumps(record) + "\n" for record in self.records)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, **record) -> None:
        clean = {key: (None if isinstance(value, float) and not math.isfinite(value) else value)
                 for key, value in record.items()}  # JSON has no NaN
        self.records.append(clean)
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_log(path: str) -> list[dict]:
    """A log's records (none if there is no file yet)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]
