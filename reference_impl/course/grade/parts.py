"""A class graded in parts (``--part i/n``), as a cluster's job array grades it: each
submission falls in one part by a hash of its name (stable across runs and machines, so every
submission is graded exactly once), and each part leaves its graded submissions in
``RESULTS/parts/part-i-of-n.json`` for the merge (:mod:`.merge`) to write the class's files."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from reference_impl.course.grade.results import Flag, Graded, TestResult

PARTS_FOLDER = "parts"


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` (0-based, as a job array's task ids)."""
    index: int
    count: int

    @property
    def file_name(self) -> str:
        return f"part-{self.index}-of-{self.count}.json"

    def holds(self, submission_name: str) -> bool:
        return part_of(submission_name, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_part(text: str) -> Part:
    """``"i/n"`` with 0 <= i < n, e.g. ``$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT``."""
    index, slash, count = text.partition("/")
    try:
        part = Part(int(index), int(count))
    except ValueError:
        part = None
    if not slash or part is None:
        raise ValueError(f"--part {text}: give it as i/n, the part's index (from 0) and the "
                         "number of parts, e.g. 0/4")
    if part.count < 1 or not 0 <= part.index < part.count:
        raise ValueError(f"--part {text}: the index must be at least 0 and below the number of "
                         f"parts ({part.count}), e.g. 0/{max(part.count, 1)}")
    return part


def part_of(submission_name: str, count: int) -> int:
    """The part a submission falls in: its name's SHA-256 modulo ``count``."""
    digest = hashlib.sha256(os.fsencode(submission_name)).digest()
    return int.from_bytes(digest[:8], "big") % count


def graded_to_data(graded: Graded) -> dict:
    return dataclasses.asdict(graded)


def graded_from_data(data: dict) -> Graded:
    return Graded(**{**data, "tests": [TestResult(**test) for test in data["tests"]],
                     "flags": [Flag(tuple(flag["labs"]), flag["text"])
                               for flag in data["flags"]]})


def save_part(part: Part, labs: list[str], class_size: int, graded: list[Graded],
              out: Path) -> Path:
    """Write a part's graded submissions (``class_size``: the whole class's count, for the
    merge to check that no submission is missing)."""
    folder = out / PARTS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / part.file_name
    data = {"part": part.index, "count": part.count, "labs": labs, "class_size": class_size,
            "graded": [graded_to_data(one) for one in graded]}
    temporary = path.with_suffix(".partial")
    temporary.write_text(json.dumps(data, indent=1) + "\n")
    temporary.replace(path)  # a part killed while writing leaves no half-written file
    return path


def load_part(path: Path) -> dict:
    data = json.loads(path.read_text())
    data["graded"] = [graded_from_data(one) for one in data["graded"]]
    return data
