"""The command: ``python -m reference_impl.course.grade SUBMISSIONS --labs 2,3 --out RESULTS``
(what it writes and how points are given: docs/grading.md, 'A whole class in one command')."""
from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
import traceback
from pathlib import Path

from reference_impl.course import grade, sandboxing, syllabus
from reference_impl.course.grade.ingest import shown
from reference_impl.course.grade.parts import parse_part, save_part
from reference_impl.course.grade.points import Points, score
from reference_impl.course.grade.reports import sheet_rows, write_class, write_submission
from reference_impl.course.grade.results import Graded, errored
from reference_impl.course.grade.running import Limits, Reaper, grade_one, gpu_slots

DESCRIPTION = grade.__doc__.splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.course.grade",
                                     description=DESCRIPTION)
    parser.add_argument("submissions", type=Path, help="a folder with one folder per submission")
    parser.add_argument("--labs", required=True, help="the labs to grade, e.g. 2,3 or lab2,lab3")
    parser.add_argument("--out", type=Path, required=True, help="where the results go")
    parser.add_argument("--points", help="points per test or per lab (JSON; its format: docs/grading.md)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="submissions graded at once (default: as many as the GPUs allow, "
                             "1 on CPU ranks)")
    parser.add_argument("--gpus-per-submission", type=int, default=4)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--test-timeout", type=float, default=120.0)
    parser.add_argument("--launch-timeout", type=float, default=None,
                        help="seconds one launch may take at most, imports included (default: "
                             "each test's own limit: 60 s, up to 120 s for the largest sweeps)")
    parser.add_argument("--after-hang", type=float, default=5.0)
    parser.add_argument("--budget", type=float, default=900.0,
                        help="seconds one submission may take in all (default 900)")
    parser.add_argument("--sandbox", default="auto", choices=sandboxing.MODES,
                        help="each launch of a submission's code in a sandbox of its own: "
                             "where one can be made (auto), always (namespaces), as a user of "
                             "its own where no namespace can be made (user: root only, in a "
                             "machine that grades and nothing else), never (none)")
    parser.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                        help="writable memory of each process of a submission, in GiB, in the "
                             "sandbox (default: a share of half the machine's, at least 2)")
    parser.add_argument("-k", default=None, help="only the tests pytest's -k selects")
    parser.add_argument("--part", default=None, metavar="I/N",
                        help="grade only part I of N of the class (from 0; each submission in "
                             "one part, by its name) and leave it for the merge: python -m "
                             "reference_impl.course.grade.merge OUT")
    args = parser.parse_args(argv)

    try:
        labs = syllabus.parse_labs(args.labs)
    except ValueError as error:
        parser.error(str(error))
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder")
    try:
        points = Points.load(args.points)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    submissions = sorted(path for path in args.submissions.iterdir() if path.is_dir())
    if not submissions:
        parser.error(f"{args.submissions} holds no submission folders")
    class_size = len(submissions)
    try:
        part = parse_part(args.part) if args.part else None
    except ValueError as error:
        parser.error(str(error))
    if part is not None:
        submissions = [path for path in submissions if part.holds(path.name)]
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        sandboxed, sandbox_line = sandboxing.choose(args.sandbox, fall_back=False)
    except ValueError as error:
        parser.error(str(error))
    class_folder = Path(tempfile.mkdtemp(prefix="grading-"))
    hidden = tuple(str(path.resolve()) for path in (class_folder, args.submissions, args.out))
    mode = "none" if not sandboxed else "user" if args.sandbox == "user" else "namespaces"
    limits = Limits(args.test_timeout, args.launch_timeout, args.after_hang, args.budget,
                    args.backend, args.k, sandbox=mode, hidden=hidden,
                    memory_limit=args.memory_limit)
    reaper, slots = Reaper(), gpu_slots(args.jobs, args.gpus_per_submission)
    free = list(range(len(slots)))
    condition = threading.Condition()
    results: dict[str, Graded] = {}
    of_class = f" (part {part} of a class of {class_size})" if part else ""
    print(f"grading {len(submissions)} submission(s){of_class}, {', '.join(labs)}, "
          f"{len(slots)} at once "
          f"({'GPUs ' + str(slots) if slots[0] is not None else 'CPU ranks'})\n{sandbox_line}",
          flush=True)

    def work(index: int, submission: Path) -> None:
        with condition:
            condition.wait_for(lambda: free)
            slot = free.pop(0)
        started = time.monotonic()
        try:
            print(f"[{index}/{len(submissions)}] {shown(submission.name)}: grading", flush=True)
            try:
                graded = grade_one(submission, labs, limits, slots[slot], reaper, class_folder)
            except Exception as error:  # the grader's own failure: an errored row, not a gap
                graded = errored(submission.name, error, traceback.format_exc(),
                                 time.monotonic() - started)
            score(graded, points)
            write_submission(graded, args.out)
            results[submission.name] = graded
            summary = ", ".join(f"{row['lab']} {row['passed']}/{row['total']} "
                                f"({row['score']:g}/{row['max_score']:g}"
                                + (f"; hidden {row['hidden_passed']}/{row['hidden_total']}"
                                   if row["hidden_total"] else "") + ")"
                                for row in sheet_rows(graded, labs))
            extra = "".join(f"; {note.splitlines()[0]}" for note in graded.notes)
            extra += "; flagged" if graded.flags else ""
            print(f"[{index}/{len(submissions)}] {shown(submission.name)}: {summary} in "
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
    shutil.rmtree(class_folder, ignore_errors=True)

    ordered = [results[path.name] for path in submissions]
    if part is not None:
        path = save_part(part, labs, class_size, ordered, args.out)
        print(f"wrote {path} and, per submission, results.json and junit.xml; once every part "
              f"is graded: python -m reference_impl.course.grade.merge {args.out}", flush=True)
    else:
        write_class(ordered, labs, args.out)
        print(f"wrote {args.out / 'grades.csv'}, {args.out / 'report.md'} and, per submission, "
              "results.json and junit.xml", flush=True)
    return 1 if any(graded.error for graded in ordered) else 0
