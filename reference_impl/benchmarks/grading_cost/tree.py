"""One command's whole process tree, measured: wall seconds, CPU seconds of every process
(:mod:`.meter`), the peak memory of them all (:mod:`.memory`); and the command's output lines
and a log file's JSON records, each with the second at which it was first seen."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from reference_impl.benchmarks.grading_cost.memory import tree_rss_bytes
from reference_impl.comm.cgroups import TreeCgroup

REPO = Path(__file__).resolve().parents[3]
METER = "reference_impl.benchmarks.grading_cost.meter"
SAMPLE_EVERY = 0.05  # seconds between two looks at the log (and at the tree's RSS)
SAMPLED = "summed RSS, sampled every 50 ms (an upper bound)"


@dataclass
class TreeRun:
    """A command's tree, measured; its output lines and its log's records, each with the
    second (from the start) at which it was seen."""
    returncode: int
    wall: float
    cpu: float
    peak_bytes: int
    memory_method: str
    largest_process_bytes: int  # the largest single process's peak RSS
    lines: list[tuple[float, str]] = field(default_factory=list)
    log: list[tuple[float, dict]] = field(default_factory=list)


def run_measured(command: list[str], environment: dict | None = None,
                 log_glob: tuple[Path, str] | None = None, memory: str = "auto") -> TreeRun:
    """Run ``command`` under the meter, reading the JSON lines of the first file matching
    ``log_glob`` (folder, pattern) as they are written; ``memory="sampled"`` sums the RSS even
    where a cgroup could be made."""
    cgroup = TreeCgroup.make("grading-cost", ("memory",)) if memory == "auto" else None
    try:
        with tempfile.TemporaryDirectory(prefix="grading-cost-meter-") as folder:
            report = Path(folder) / "meter.json"
            started = time.monotonic()
            process = subprocess.Popen(
                [sys.executable, "-m", METER, str(report), "--", *command], cwd=REPO,
                env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                stdin=subprocess.DEVNULL, preexec_fn=cgroup.join if cgroup else None)
            watcher = Watcher(process.pid, started, log_glob, sample_rss=cgroup is None)
            watcher.start()
            try:
                lines = [(time.monotonic() - started, line.rstrip("\n")) for line in process.stdout]
                process.wait()
                wall = time.monotonic() - started
            finally:
                watcher.stop()
            peak = cgroup.peak_memory_bytes() if cgroup else watcher.peak_rss
            usage = json.loads(report.read_text())
    finally:
        if cgroup:
            cgroup.remove()
    return TreeRun(process.returncode, wall, usage["cpu"], peak,
                   cgroup.memory_method if cgroup else SAMPLED, usage["largest_process_bytes"], lines,
                   watcher.records)


class Watcher(threading.Thread):
    """Every ``SAMPLE_EVERY`` s until stopped: the log's new records, timed as they appear (a
    log its writer removes at the end is read while it lasts), and, without a cgroup, the
    tree's summed RSS."""

    def __init__(self, root: int, started: float, log_glob: tuple[Path, str] | None,
                 sample_rss: bool):
        super().__init__(daemon=True)
        self.root, self.started = root, started
        self.log_glob, self.sample_rss = log_glob, sample_rss
        self.records: list[tuple[float, dict]] = []
        self.peak_rss = 0
        self.log, self.offset, self.partial = None, 0, ""
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_EVERY):
            self.look()
        self.look()

    def look(self) -> None:
        if self.sample_rss:
            self.peak_rss = max(self.peak_rss, tree_rss_bytes(self.root))
        if self.log_glob is not None:
            self.read_log()

    def read_log(self) -> None:
        if self.log is None:
            folder, pattern = self.log_glob
            self.log = next(iter(folder.glob(pattern)), None)
            if self.log is None:
                return
        try:
            with open(self.log) as handle:
                handle.seek(self.offset)
                text = handle.read()
                self.offset = handle.tell()
        except OSError:
            return
        seen = time.monotonic() - self.started
        *complete, self.partial = (self.partial + text).split("\n")
        for line in complete:
            with contextlib.suppress(json.JSONDecodeError):
                self.records.append((seen, json.loads(line)))

    def stop(self) -> None:
        self.done.set()
        self.join()
