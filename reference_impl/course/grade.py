"""Grade a folder of submissions in one command: a grade sheet, Gradescope and JUnit files.

    python -m reference_impl.course.grade SUBMISSIONS --labs 2,3 --out RESULTS

``SUBMISSIONS`` holds one folder per submission (its student files, ``tp_layers.py`` and the
rest, at its top or in a ``labs/`` folder inside it). Each submission is graded by the kit's
graded tests (``pytest --impl``) in a process tree of its own: its own session and process
group, ended as a whole when it is done (this process is the "subreaper" of whatever escapes
the group, so that is ended too), and a temporary folder of its own, removed afterwards.
Limits: ``--test-timeout`` per test, ``--launch-timeout`` per launch of ranks, ``--budget`` for
the whole submission (once a launch has hung, later ones get ``--after-hang`` seconds; once the
budget is spent the remaining tests fail at once, and the run is killed if it goes on longer).
On a machine with GPUs, ``--jobs`` submissions run at once, each seeing only its own
``--gpus-per-submission`` GPUs (``CUDA_VISIBLE_DEVICES``); without GPUs they run on CPU ranks.

Written to ``RESULTS``:

* ``<submission>/results.json``: Gradescope's autograder format (``score`` and, per test,
  ``name``, ``score``, ``max_score``, ``status`` and the ``output`` naming the mistake);
* ``<submission>/junit.xml``: JUnit XML, for CI dashboards;
* ``grades.csv``: one row per submission and lab (submission, lab, passed, total, score,
  max_score, flags);
* ``report.md``: the most common failures across the course.

Points come from ``--points FILE`` (JSON), one place for the whole course::

    {"default": 1,                                   # each test, unless said otherwise
     "labs": {"lab2": 20},                           # a lab's points, shared by its tests
     "tests": {"test_lab2_tp_layers.py::test_tp_mlp_matches_the_single_device_mlp": 4},
     "flagged": "zero"}                              # a flagged lab scores 0 ("keep": flag only)

A test named under ``tests`` (a node id, or its start: every parametrization) gets those
points each. A submission whose file imports the reference implementation of that very file
is *flagged* in its results, with the line.

Student code runs with the grader's rights: run this inside a container or a throwaway VM
with no network (README, "For graders").
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from reference_impl.course import syllabus

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
MESSAGE_LIMIT = 4_000  # characters of a failing test's output in results.json
OUTPUT_TAIL = 20_000  # bytes of the graded run's own output kept
KILL_GRACE = 30.0  # seconds past the budget before the graded run is killed
PROGRESS_EVERY = 15.0  # seconds between progress lines while a submission runs


# ------------------------------------------------------------ points

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


# ------------------------------------------------------------ one submission

@dataclass
class TestResult:
    name: str
    lab: str
    passed: bool
    skipped: bool
    message: str
    duration: float
    score: float = 0.0
    max_score: float = 0.0


@dataclass
class Graded:
    submission: str
    tests: list
    flags: list
    notes: list
    seconds: float


def files_of(submission: Path) -> Path:
    """The folder holding a submission's student files."""
    inner = submission / "labs"
    return inner if inner.is_dir() else submission


def graded_run_command(folder: Path, labs: list[str], log: Path, ini: Path, args) -> list[str]:
    test_files = sorted(str(path) for lab in labs for path in TESTS.glob(f"test_{lab}_*.py"))
    command = [sys.executable, "-m", "pytest", *test_files, "-c", str(ini), "--rootdir",
               str(REPO), "-p", "no:cacheprovider", "-q", "--impl", str(folder), "-m",
               " or ".join(labs), "--grading-log", str(log), "--timeout",
               str(args.test_timeout), "--launch-timeout", str(args.launch_timeout),
               "--budget", str(args.budget), "--after-hang", str(args.after_hang),
               "--backend", args.backend]
    return command + (["-k", args.k] if args.k else [])


def grade_one(submission: Path, labs: list[str], args, gpus: list[int] | None,
              reaper: "Reaper") -> Graded:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="grade-"))
    try:
        folder = workdir / "labs"
        folder.mkdir()
        for path in files_of(submission).glob("*.py"):
            shutil.copy(path, folder / path.name)
        ini, log, output = workdir / "pytest.ini", workdir / "log.jsonl", workdir / "output.txt"
        ini.write_text("[pytest]\n")
        environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        environment.pop("PYTEST_ADDOPTS", None)
        if gpus is not None:
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        with open(output, "wb") as sink:
            process = reaper.start(graded_run_command(folder, labs, log, ini, args), workdir,
                                   environment, sink)
            progress = threading.Thread(target=_progress, args=(submission.name, log, process),
                                        daemon=True)
            progress.start()
            killed_for_time = False
            try:
                process.wait(timeout=args.budget + KILL_GRACE)
            except subprocess.TimeoutExpired:
                killed_for_time = True
            reaper.end(process)
        tail = output.read_bytes()[-OUTPUT_TAIL:].decode(errors="replace")
        return _results(submission.name, labs, log, process.returncode, killed_for_time, tail,
                        time.monotonic() - started, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _progress(name, log, process):
    while process.poll() is None:
        time.sleep(PROGRESS_EVERY)
        if process.poll() is None:
            done = sum(1 for record in _records(log) if record.get("event") == "report"
                       and record.get("phase") == "call")
            print(f"    ... {name}: {done} tests done", flush=True)


def _records(log: Path) -> list[dict]:
    if not log.exists():
        return []
    records = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def _the_mistake(message: str) -> str:
    """The lines of a pytest failure that say what is wrong (its ``E`` lines), capped."""
    lines = [line[4:] if line.startswith("E   ") else line[1:].strip()
             for line in message.splitlines() if line.startswith("E ")]
    text = "\n".join(lines) if lines else message.strip()
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + "\n[... cut]"


def _results(name, labs, log, returncode, killed_for_time, tail, seconds, args) -> Graded:
    records = _records(log)
    collected = next((r["tests"] for r in records if r.get("event") == "collected"), None)
    finished = any(r.get("event") == "finished" for r in records)
    started = [r["nodeid"] for r in records if r.get("event") == "start"]
    flags = [f"{', '.join(r['labs'])}: {r['text']}" for r in records
             if r.get("event") == "flag" and set(r["labs"]) & set(labs)]
    outcomes = {}  # nodeid -> [lab, failed, skipped, message, duration]
    for record in records:
        if record.get("event") != "report":
            continue
        entry = outcomes.setdefault(record["nodeid"], [record["lab"], False, False, "", 0.0])
        entry[4] += record.get("duration", 0.0)
        if record["outcome"] == "failed":
            entry[1] = True
            entry[3] = entry[3] or _the_mistake(record.get("message", ""))
        elif record["outcome"] == "skipped":
            entry[2] = True
    notes = []
    if killed_for_time:
        notes.append(f"the graded run went past its budget of {args.budget:g} s (+ "
                     f"{KILL_GRACE:g} s) and was killed")
    elif not finished:
        how = (f"killed by signal {signal.Signals(-returncode).name}" if returncode < 0
               else f"exited with code {returncode}")
        where = f" while running {started[-1]}" if started else ""
        notes.append(f"the graded run ended before it finished ({how}{where}): the "
                     "submission's code ended the grader's own process")
    if any("did not finish within" in entry[3] for entry in outcomes.values()):
        notes.append("hung: a launch did not finish within its time limit (a deadlock or an "
                     "endless loop)")
    tests = []
    if collected is None:
        notes.append("the graded run did not get as far as collecting the tests; its output:\n"
                     + tail[-MESSAGE_LIMIT:])
    for test in collected or []:
        lab, failed, skipped, message, duration = outcomes.get(
            test["nodeid"], [test["lab"], True, False, "", 0.0])
        if test["nodeid"] not in outcomes:
            message = "not run: " + (notes[0] if notes else "the graded run ended before it")
        short = test["nodeid"].split("/")[-1]
        tests.append(TestResult(short, lab, not failed and not skipped, skipped and not failed,
                                message, duration))
    for record in records:  # a test file that could not be imported
        if record.get("event") == "report" and record.get("phase") == "collect":
            tests.append(TestResult(record["nodeid"].split("/")[-1], record["lab"], False, False,
                                    _the_mistake(record.get("message", "")), 0.0))
    return Graded(name, tests, flags, notes, seconds)


def score(graded: Graded, points: Points) -> None:
    per_lab = collections.Counter(test.lab for test in graded.tests)
    flagged_labs = {lab for flag in graded.flags for lab in flag.split(":")[0].split(", ")}
    for test in graded.tests:
        test.max_score = points.of(test.name, test.lab, per_lab[test.lab])
        keep = points.flagged == "keep" or test.lab not in flagged_labs
        test.score = test.max_score if test.passed and keep else 0.0


# ------------------------------------------------------------ what is written

def gradescope(graded: Graded) -> dict:
    tests = [{"name": test.name, "score": round(test.score, 4),
              "max_score": round(test.max_score, 4),
              "status": "passed" if test.passed else "failed",
              "output": "" if test.passed else (test.message or "skipped")}
             for test in graded.tests]
    for flag in graded.flags:
        tests.append({"name": "flagged: uses the reference implementation", "score": 0,
                      "max_score": 0, "status": "failed", "output": flag})
    return {"score": round(sum(test.score for test in graded.tests), 4),
            "execution_time": round(graded.seconds, 1),
            "output": "\n".join(graded.notes + [f"flagged: {flag}" for flag in graded.flags]),
            "tests": tests}


def junit(graded: Graded) -> ElementTree.ElementTree:
    failures = sum(not test.passed and not test.skipped for test in graded.tests)
    suite = ElementTree.Element("testsuite", name=graded.submission, tests=str(len(graded.tests)),
                                failures=str(failures),
                                skipped=str(sum(t.skipped for t in graded.tests)),
                                time=f"{graded.seconds:.1f}")
    for test in graded.tests:
        case = ElementTree.SubElement(suite, "testcase", classname=f"{graded.submission}.{test.lab}",
                                      name=test.name, time=f"{test.duration:.2f}")
        if test.skipped:
            ElementTree.SubElement(case, "skipped", message=test.message[:200])
        elif not test.passed:
            failure = ElementTree.SubElement(case, "failure",
                                             message=(test.message.splitlines() or [""])[0][:200])
            failure.text = test.message
    if graded.notes or graded.flags:
        ElementTree.SubElement(suite, "system-out").text = "\n".join(graded.notes + graded.flags)
    return ElementTree.ElementTree(suite)


def sheet_rows(graded: Graded, labs: list[str]) -> list[dict]:
    rows = []
    for lab in labs:
        tests = [test for test in graded.tests if test.lab == lab]
        flags = [flag for flag in graded.flags if lab in flag.split(":")[0].split(", ")]
        rows.append({"submission": graded.submission, "lab": lab,
                     "passed": sum(test.passed for test in tests), "total": len(tests),
                     "score": round(sum(test.score for test in tests), 2),
                     "max_score": round(sum(test.max_score for test in tests), 2),
                     "flags": " | ".join(flags), "notes": " | ".join(
                         note.splitlines()[0] for note in graded.notes)})
    return rows


def common_failures(results: list[Graded], most: int = 10) -> str:
    counter = collections.Counter()
    for graded in results:
        for test in graded.tests:
            if not test.passed and not test.skipped:
                first = (test.message.splitlines() or ["(no message)"])[0][:160]
                counter[re.sub(r"\[.*\]$", "", test.name), first] += 1
    lines = ["# Most common failures", "",
             f"{len(results)} submission(s) graded.", "",
             "| submissions | test | first line of the failure |", "|---|---|---|"]
    for (name, first), count in counter.most_common(most):
        lines.append(f"| {count} | `{name}` | {first.replace('|', '/')} |")
    hung = [g.submission for g in results if any(note.startswith("hung") for note in g.notes)]
    flagged = [g.submission for g in results if g.flags]
    lines += ["", f"Hung: {', '.join(hung) or 'none'}.", f"Flagged: {', '.join(flagged) or 'none'}."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ processes

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
        for pid in children_of(os.getpid()) - self.running:
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


# ------------------------------------------------------------ the command

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", type=Path, help="a folder with one folder per submission")
    parser.add_argument("--labs", required=True, help="the labs to grade, e.g. 2,3 or lab2,lab3")
    parser.add_argument("--out", type=Path, required=True, help="where the results go")
    parser.add_argument("--points", help="points per test or per lab (JSON; see above)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="submissions graded at once (default: as many as the GPUs allow, "
                             "1 on CPU ranks)")
    parser.add_argument("--gpus-per-submission", type=int, default=4)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--test-timeout", type=float, default=120.0)
    parser.add_argument("--launch-timeout", type=float, default=60.0)
    parser.add_argument("--after-hang", type=float, default=5.0)
    parser.add_argument("--budget", type=float, default=900.0,
                        help="seconds one submission may take in all (default 900)")
    parser.add_argument("-k", default=None, help="only the tests pytest's -k selects")
    args = parser.parse_args(argv)

    labs = [lab if lab.startswith("lab") else f"lab{lab}" for lab in args.labs.split(",")]
    unknown = [lab for lab in labs if lab not in syllabus.markers()]
    if unknown:
        parser.error(f"--labs: no such lab {', '.join(unknown)}; the labs are "
                     f"{', '.join(syllabus.markers())}")
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder")
    try:
        points = Points.load(args.points)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    submissions = sorted(path for path in args.submissions.iterdir() if path.is_dir())
    if not submissions:
        parser.error(f"{args.submissions} holds no submission folders")
    args.out.mkdir(parents=True, exist_ok=True)

    reaper, slots = Reaper(), gpu_slots(args.jobs, args.gpus_per_submission)
    free = list(range(len(slots)))
    condition = threading.Condition()
    results: dict[str, Graded] = {}
    print(f"grading {len(submissions)} submission(s), {', '.join(labs)}, {len(slots)} at once "
          f"({'GPUs ' + str(slots) if slots[0] is not None else 'CPU ranks'})", flush=True)

    def work(index: int, submission: Path) -> None:
        with condition:
            condition.wait_for(lambda: free)
            slot = free.pop(0)
        try:
            print(f"[{index}/{len(submissions)}] {submission.name}: grading", flush=True)
            graded = grade_one(submission, labs, args, slots[slot], reaper)
            score(graded, points)
            write_submission(graded, args.out)
            results[submission.name] = graded
            summary = ", ".join(f"{row['lab']} {row['passed']}/{row['total']} "
                                f"({row['score']:g}/{row['max_score']:g})"
                                for row in sheet_rows(graded, labs))
            extra = "".join(f"; {note.splitlines()[0]}" for note in graded.notes)
            extra += "; flagged" if graded.flags else ""
            print(f"[{index}/{len(submissions)}] {submission.name}: {summary} in "
                  f"{graded.seconds:.1f} s{extra}", flush=True)
        finally:
            with condition:
                free.append(slot)
                condition.notify()

    threads = [threading.Thread(target=work, args=(index, submission))
               for index, submission in enumerate(submissions, start=1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    ordered = [results[path.name] for path in submissions if path.name in results]
    with open(args.out / "grades.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["submission", "lab", "passed", "total",
                                                    "score", "max_score", "flags", "notes"])
        writer.writeheader()
        for graded in ordered:
            writer.writerows(sheet_rows(graded, labs))
    (args.out / "report.md").write_text(common_failures(ordered))
    print(f"wrote {args.out / 'grades.csv'}, {args.out / 'report.md'} and, per submission, "
          "results.json and junit.xml", flush=True)
    return 0 if len(ordered) == len(submissions) else 1


def write_submission(graded: Graded, out: Path) -> None:
    folder = out / graded.submission
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(gradescope(graded), indent=2) + "\n")
    junit(graded).write(folder / "junit.xml", encoding="unicode")


if __name__ == "__main__":
    sys.exit(main())
