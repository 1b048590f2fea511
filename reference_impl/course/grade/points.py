"""Points per test or per lab, from one JSON file for the whole course (the package's
docstring shows its keys), and a graded submission's scores."""
from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field
from pathlib import Path

from reference_impl.course.grade.results import Graded


@dataclass
class Points:
    default: float = 1.0
    labs: dict = field(default_factory=dict)
    tests: dict = field(default_factory=dict)
    flagged: str = "zero"

    @classmethod
    def load(cls, path: str | None) -> "Points":
        if path is None:
            return cls()
        data = json.loads(Path(path).read_text())
        unknown = set(data) - {"default", "labs", "tests", "flagged"}
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}; use default, labs, tests, "
                             "flagged")
        if data.get("flagged", "zero") not in ("zero", "keep"):
            raise ValueError(f"{path}: flagged must be 'zero' or 'keep', got {data['flagged']!r}")
        return cls(**data)

    def of(self, name: str, lab: str, tests_in_lab: int) -> float:
        for prefix, points in self.tests.items():
            if name == prefix or name.startswith(prefix + "["):
                return float(points)
        if lab in self.labs:
            return float(self.labs[lab]) / tests_in_lab
        return float(self.default)


def score(graded: Graded, points: Points) -> None:
    """Each test's score and maximum; a flagged lab scores 0 unless the points say "keep"."""
    per_lab = collections.Counter(test.lab for test in graded.tests)
    flagged_labs = {lab for flag in graded.flags for lab in flag.labs}
    for test in graded.tests:
        test.max_score = points.of(test.name, test.lab, per_lab[test.lab])
        keep = points.flagged == "keep" or test.lab not in flagged_labs
        test.score = test.max_score if test.passed and keep else 0.0
