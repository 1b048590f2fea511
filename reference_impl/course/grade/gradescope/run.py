"""Grade the submission in Gradescope's container, as ``run_autograder`` asks (as root):

    python -m reference_impl.course.grade.gradescope.run [--root /autograder]

The submission (``/autograder/submission``) is graded by the batch grader's own code
(:func:`reference_impl.course.grade.running.grade_one`), in the kit's sandbox where the
container lets namespaces be made, and otherwise as a box user (``--sandbox user``:
:mod:`reference_impl.comm.user_box`); first the grader's files are closed to every other user
(the hidden checks, the results, the submission as handed in and its metadata). Once the
student's code has stopped (every process of the box user ended), the grader writes
``/autograder/results/results.json``: both tiers, each check's visibility, and a first line
that says which sandbox held.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from reference_impl.comm.user_box import BOX_UID, end_everything_of
from reference_impl.comm.user_box import unavailable as no_box_user
from reference_impl.course import sandboxing
from reference_impl.course.grade.gradescope.build import CONFIG
from reference_impl.course.grade.points import Points, score
from reference_impl.course.grade.reports import gradescope
from reference_impl.course.grade.results import errored
from reference_impl.course.grade.running import HIDDEN_TESTS, Limits, Reaper, grade_one, gpu_slots

DEFAULT_ROOT = Path("/autograder")


def closed(root: Path) -> list[Path]:
    """What no user but the grader (root) may read or write in the container."""
    return [HIDDEN_TESTS, root / "results", root / "submission",
            root / "submission_metadata.json"]


def close(paths) -> None:
    for path in paths:
        if path.exists():
            os.chown(path, 0, 0)
            os.chmod(path, 0o700 if path.is_dir() else 0o600)


def choose(mode: str) -> tuple[str, str]:
    """The sandbox to grade in (``namespaces`` where the container allows them, else
    ``user``), and the line that says so; ValueError where there is none."""
    if mode == "auto":
        reason = sandboxing.probe()
        if reason is None:
            mode = "namespaces"
        elif no_box_user() is None:
            return "user", f"sandbox: user (no namespaces here: {reason}): {sandboxing.AS_A_USER}"
        else:
            raise ValueError(f"no sandbox can be made here: {reason}; {no_box_user()}")
    return mode, sandboxing.choose(mode, fall_back=False)[1]


def grade(root: Path, mode: str) -> dict:
    """The submission's ``results.json``, graded in sandbox ``mode``."""
    settings = json.loads((root / "source" / CONFIG).read_text())
    points = Points.load(str(root / "source" / settings["points"]) if settings["points"] else None)
    started = time.monotonic()
    submission = root / "submission"
    try:
        mode, line = choose(mode)
    except ValueError as error:
        return {"score": 0, "output": f"not graded: {error} (docs/grading.md, 'Gradescope')",
                "tests": []}
    print(line, flush=True)
    class_folder = Path(tempfile.mkdtemp(prefix="grading-"))
    limits = Limits(sandbox=mode, hidden=tuple(str(path) for path in (
        class_folder, submission, root / "results")))
    try:
        graded = grade_one(submission, settings["labs"], limits, gpu_slots(1, 1)[0], Reaper(),
                           class_folder)
    except Exception as error:  # the grader's own failure: said in the results
        graded = errored(submission.name, error, traceback.format_exc(),
                         time.monotonic() - started)
    finally:
        if mode == "user":
            end_everything_of(BOX_UID)  # nothing of the student's runs from here on
        shutil.rmtree(class_folder, ignore_errors=True)
    score(graded, points)
    results = gradescope(graded)
    results["output"] = "\n".join(filter(None, (line, results["output"])))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.course.grade.gradescope.run",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help="where Gradescope's folders are (default /autograder)")
    parser.add_argument("--sandbox", default=os.environ.get("AUTOGRADER_SANDBOX", "auto"),
                        choices=("auto", "namespaces", "user"),
                        help="the sandbox (default auto: namespaces where the container allows "
                             "them, else a box user)")
    parser.add_argument("--check", action="store_true",
                        help="only say which sandbox a grading would use here (setup.sh's test)")
    args = parser.parse_args(argv)
    if args.check:
        try:
            print(choose(args.sandbox)[1])
        except ValueError as error:
            print(f"autograder: {error}", file=sys.stderr)
            return 1
        return 0
    close(closed(args.root))
    results = grade(args.root, args.sandbox)
    (args.root / "results").mkdir(mode=0o700, exist_ok=True)
    (args.root / "results" / "results.json").write_text(json.dumps(results, indent=2) + "\n",
                                                         encoding="utf-8")
    print(f"score {results['score']:g}; wrote {args.root / 'results' / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
