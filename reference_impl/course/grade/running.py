"""One submission's graded run: the kit's graded tests, public and hidden (``pytest --impl``
on ``tests/labs/test_labN_*.py`` and ``tests/labs/hidden/test_labN_*.py``) on its files, in a
process tree of its own (its own session and process group, ended as a whole when it is done;
this process is the "subreaper" of whatever escapes the group, so that is ended too) and a
folder of its own in the class's, removed afterwards; under limits per test, per launch and
per submission. pytest's process never runs the submission's code: its launches do, each in a
sandbox (``--sandbox``) that hides the class's folder (the other submissions, this one's log),
the submissions and the results, so the log the verdict is read from is the grader's alone.
The submission's files are taken in as data first (:mod:`.ingest`): no link is followed."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from reference_impl.comm.rank_failures import rank_server_pid
from reference_impl.course.grade.ingest import ingest, shown
from reference_impl.course.grade.results import Graded, RunEnd, read_log, results_of
from reference_impl.course.grade.scratch import SCRATCH_BYTES, SCRATCH_FILES
from reference_impl.course.plugin_args import plugin_args
from reference_impl.course.private_files import owner_only

REPO = Path(__file__).resolve().parents[3]
GRADED_TESTS = REPO / "tests" / "labs"
HIDDEN_TESTS = GRADED_TESTS / "hidden"  # the hidden checks: the grader's, not in the handout
OUTPUT_TAIL = 20_000  # bytes of the graded run's own output kept
KILL_GRACE = 30.0  # seconds past the budget before the graded run is killed
PROGRESS_EVERY = 15.0  # seconds between progress lines while a submission runs


@dataclass(frozen=True)
class Limits:
    """What a graded run may take, and how it runs (the command's options)."""
    test_timeout: float = 120.0  # seconds per test
    launch_timeout: float | None = None  # at most, seconds per launch (None: the tests' own)
    after_hang: float = 5.0  # seconds per launch once one has hung
    budget: float = 900.0  # seconds for the whole submission
    backend: str = "auto"
    select: str | None = None  # pytest's -k
    sandbox: str = "auto"  # the launches' sandbox (pytest's --sandbox)
    hidden: tuple[str, ...] = ()  # folders the submission's code must not see
    memory_limit: float | None = None  # GiB of writable memory per sandboxed process


def graded_test_files(labs: list[str]) -> list[str]:
    """The labs' graded test files: the public ones, then the hidden ones (so that a hidden
    check that hangs shortens no public check's time limit)."""
    return [str(path) for folder in (GRADED_TESTS, HIDDEN_TESTS)
            for path in sorted(path for lab in labs for path in folder.glob(f"test_{lab}_*.py"))]


def graded_run_command(folder: Path, labs: list[str], log: Path, ini: Path, scratch: Path,
                       limits: Limits) -> list[str]:
    """pytest on the graded tests of ``labs``, with ``scratch`` a bounded folder of its own
    (:mod:`.scratch`)."""
    bounded = [sys.executable, "-m", "reference_impl.course.grade.scratch", str(scratch),
               str(SCRATCH_BYTES), str(SCRATCH_FILES), "--"]
    # nbval reads notebooks, which grading never runs: not loading it saves ~1.8 s a submission.
    command = [*bounded, sys.executable, "-m", "pytest", *plugin_args(),
               *graded_test_files(labs), "-c", str(ini), "--rootdir", str(REPO), "-p",
               "no:cacheprovider", "-p", "no:nbval", "-q", "--impl", str(folder), "-m",
               " or ".join(labs), "--grading-log", str(log), "--basetemp", str(scratch / "pytest"),
               "--timeout", str(limits.test_timeout), "--budget", str(limits.budget), "--after-hang",
               str(limits.after_hang), "--backend", limits.backend, "--sandbox", limits.sandbox]
    if limits.launch_timeout is not None:
        command += ["--launch-timeout", str(limits.launch_timeout)]
    for path in limits.hidden:
        command += ["--sandbox-hide", path]
    if limits.memory_limit is not None:
        command += ["--memory-limit", str(limits.memory_limit)]
    return command + (["-k", limits.select] if limits.select else [])


def _as_handed_in(text: str, workdir: Path) -> str:
    """``text`` without the grader's folder: a submission's file reads as it was handed in
    (``labs/collectives.py``), the same wherever and in whichever part it was graded."""
    return text.replace(str(workdir) + os.sep, "")


def grade_one(submission: Path, labs: list[str], limits: Limits, gpus: list[int] | None,
              reaper: "Reaper", class_folder: Path | None = None) -> Graded:
    """Grade ``submission`` in a folder of its own inside ``class_folder`` (which the
    sandbox hides: give it in ``limits.hidden``)."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="grade-", dir=class_folder))
    try:
        folder, scratch = workdir / "labs", workdir / "scratch"
        folder.mkdir()
        (scratch / "tmp").mkdir(parents=True)
        taken = ingest(submission, folder)  # as data: no link followed, within bounds
        ini, log, output = workdir / "pytest.ini", workdir / "log.jsonl", workdir / "output.txt"
        ini.write_text("[pytest]\n")
        environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
                       "TMPDIR": str(scratch / "tmp")}  # where its launches' folders go
        environment.pop("PYTEST_ADDOPTS", None)
        if gpus is not None:
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        with open(output, "wb", opener=owner_only) as sink:
            process = reaper.start(
                graded_run_command(folder, labs, log, ini, scratch, limits),
                workdir, environment, sink)
            progress = threading.Thread(target=_progress, daemon=True,
                                        args=(shown(submission.name), log, process))
            progress.start()
            killed_for_time = False
            try:
                process.wait(timeout=limits.budget + KILL_GRACE)
            except subprocess.TimeoutExpired:
                killed_for_time = True
            reaper.end(process)
        tail = output.read_bytes()[-OUTPUT_TAIL:].decode(errors="replace")
        end = RunEnd(process.returncode, killed_for_time, limits.budget, KILL_GRACE,
                     _as_handed_in(tail, workdir))
        records = read_log(log)
        for record in records:
            if isinstance(record.get("message"), str):
                record["message"] = _as_handed_in(record["message"], workdir)
        graded = results_of(submission.name, labs, records, end, time.monotonic() - started)
        graded.notes += [taken.note()] if taken.refused else []
        return graded
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _progress(name, log, process):
    while process.poll() is None:
        time.sleep(PROGRESS_EVERY)
        if process.poll() is None:
            done = sum(1 for record in read_log(log) if record.get("event") == "report"
                       and record.get("phase") == "call")
            print(f"    ... {name}: {done} tests done", flush=True)


class Reaper:
    """Starts each graded run in its own session and ends it as a whole; as the subreaper of
    everything below it (Linux), it also ends what escaped a run's process group."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = set()
        if sys.platform.startswith("linux"):
            pr_set_child_subreaper = 36
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1)

    def start(self, command, cwd, environment, sink) -> subprocess.Popen:
        with self.lock:
            process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=sink,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
            self.running.add(process.pid)
            return process

    def end(self, process: subprocess.Popen) -> None:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)  # the session's group: all it started
        process.wait()
        with self.lock:
            self.running.discard(process.pid)
            self._end_strays()

    def _end_strays(self) -> None:
        """Kill and reap this process's children that are not a running graded run: what a
        submission started and moved out of its process group, re-parented here."""
        for pid in children_of(os.getpid()) - self.running - {rank_server_pid()}:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)


def children_of(parent: int, running_only: bool = False) -> set[int]:
    """The child processes of ``parent``, read from /proc (zombies too, unless
    ``running_only``)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and not (running_only and fields[0] == "Z"):
            children.add(int(stat.parent.name))
    return children


def gpu_slots(jobs: int | None, per_submission: int) -> list[list[int] | None]:
    """The GPUs each parallel job sees: disjoint sets of ``per_submission``; or CPU slots."""
    import torch  # only here: the rest of this module runs without it
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= per_submission:
        slots = [list(range(start, start + per_submission))
                 for start in range(0, gpus - per_submission + 1, per_submission)]
        return slots[:jobs] if jobs else slots
    return [None] * (jobs or 1)
