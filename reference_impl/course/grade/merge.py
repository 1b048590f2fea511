"""The class's ``grades.csv`` and ``report.md`` from the parts a job array graded
(``--part i/n``): the same bytes as grading the class at once.

    python -m reference_impl.course.grade.merge RESULTS

It refuses, saying which, when a part is missing or was graded for other labs or another
class, so that a part that failed is never merged as if its students had none."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reference_impl.course.grade.parts import PARTS_FOLDER, load_part
from reference_impl.course.grade.reports import write_class


def merged(out: Path) -> tuple[list, list[str]]:
    """The class's graded submissions, in the order the grader writes them, and the labs."""
    paths = sorted((out / PARTS_FOLDER).glob("part-*-of-*.json"))
    if not paths:
        raise ValueError(f"{out / PARTS_FOLDER} holds no parts: grade with --part i/n and "
                         f"--out {out} first")
    parts = [load_part(path) for path in paths]
    first = parts[0]
    for part, path in zip(parts, paths):
        for key in ("count", "labs", "class_size"):
            if part[key] != first[key]:
                raise ValueError(f"{path.name} was graded with {key} {part[key]}, "
                                 f"{paths[0].name} with {first[key]}: merge the parts of one "
                                 "grading only")
    missing = sorted(set(range(first["count"])) - {part["part"] for part in parts})
    if missing:
        raise ValueError(f"parts {', '.join(map(str, missing))} of {first['count']} are missing "
                         f"from {out / PARTS_FOLDER}: grade them (--part i/{first['count']}), "
                         "then merge")
    graded = [one for part in parts for one in part["graded"]]
    names = [one.submission for one in graded]
    if len(set(names)) != len(names) or len(names) != first["class_size"]:
        raise ValueError(f"the parts hold {len(set(names))} submissions ({len(names)} results) "
                         f"but the class has {first['class_size']}: were the parts graded "
                         "from the same submissions folder?")
    return sorted(graded, key=lambda one: one.submission), first["labs"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.course.grade.merge",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the --out folder the parts were graded into")
    args = parser.parse_args(argv)
    try:
        graded, labs = merged(args.out)
    except (OSError, ValueError, KeyError) as error:
        parser.error(str(error))
    write_class(graded, labs, args.out)
    print(f"merged {len(graded)} submission(s) into {args.out / 'grades.csv'} and "
          f"{args.out / 'report.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
