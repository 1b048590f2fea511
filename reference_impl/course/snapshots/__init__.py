"""Expected values of the graded checks, written by the reference when the kit is built.

A graded check that needs an exercise's answer (a layout, the positions a rank holds, the
experts a router picks) reads it from a snapshot instead of computing it, so the handout
holds the numbers and never the algorithm (as Stanford CS336's assignments keep their tests'
``_snapshots``). Each lab with snapshots has a maker here, ``labN.py``, whose ``make()``
returns a dict of tensors, numbers, lists and strings computed by the reference; it is
stored in ``tests/labs/snapshots/labN.pt``. The hidden checks' values, from a maker's
``make_hidden()``, are stored beside the hidden checks, in ``tests/labs/hidden/snapshots/``,
which the handout leaves out with them: :func:`snapshot` adds them to the public ones where that
file is present (a table of the same name gains the hidden rows), so a student's files meet the
hidden draws' answers nowhere. The makers stay with the kit (the handout leaves
them out); a kit test checks that the stored snapshots are what the makers give today: bit for
bit on the build of torch that wrote them, and on another (a GPU build rounds differently)
floating-point tensors within :data:`ACROSS_BUILDS`, the tightest tolerance a graded check
compares them with.

    python -m reference_impl.course.snapshots           # rewrite every snapshot
    python -m reference_impl.course.snapshots lab8      # rewrite lab 8's
    python -m reference_impl.course.snapshots --check   # exit 1 if one is out of date
"""
from __future__ import annotations

import argparse
import importlib
from functools import cache
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
STORED = REPO / "tests" / "labs" / "snapshots"
STORED_HIDDEN = REPO / "tests" / "labs" / "hidden" / "snapshots"
MAKERS = Path(__file__).resolve().parent
# Floating-point tensors made by another build of torch, or on another CPU (its vector width
# changes the order of sums): within the graded checks' tolerances, the absolute one in units of
# the tensor's largest element where that is above 1, as the graded checks compare a sum's
# rounding (fp32 and fp64: atol = rtol = 1e-5; bf16 and fp16: atol 1e-2). Lab 9's gate gradient
# (largest element 2.6) moves by 3e-5 between two x86 CPUs.
ACROSS_BUILDS = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-5, rtol=1e-5),
                 torch.bfloat16: dict(atol=1e-2, rtol=0.0), torch.float16: dict(atol=1e-2, rtol=0.0)}


def makers() -> list[str]:
    """The labs that have a snapshot maker: ``["lab1", "lab8", ...]``."""
    return sorted(path.stem for path in MAKERS.glob("lab*.py"))


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True) if path.exists() else {}


def merged(public: dict, hidden: dict) -> dict:
    """The public values with the hidden ones added; a table (a dict) in both gains the hidden
    rows."""
    both = dict(public)
    for key, value in hidden.items():
        both[key] = {**public[key], **value} if isinstance(public.get(key), dict) else value
    return both


@cache
def _stored(lab: str) -> dict:
    public = _paths(lab)[0]
    if not public.exists():
        raise FileNotFoundError(f"no snapshot {public}: write it with "
                                "`python -m reference_impl.course.snapshots`")
    return merged(*stored_apart(lab))


def snapshot(lab: str, key: str):
    """The stored value ``key`` of ``lab``'s snapshot, the hidden checks' rows included where
    their file is present."""
    values = _stored(lab)
    if key not in values:
        raise KeyError(f"{lab}'s snapshot has no {key!r}: its keys are {sorted(values)}; "
                       "rewrite it with `python -m reference_impl.course.snapshots`")
    return values[key]


def made(lab: str) -> tuple[dict, dict]:
    """What ``lab``'s maker gives now: the public values and the hidden checks' ones."""
    maker = importlib.import_module(f"{__name__}.{lab}")
    return maker.make(), (maker.make_hidden() if hasattr(maker, "make_hidden") else {})


def same(a, b, across_builds: bool = False) -> bool:
    """Whether two snapshot values are equal, tensors bit for bit (dtype and shape too); with
    ``across_builds``, floating-point tensors within :data:`ACROSS_BUILDS`."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if across_builds and a.dtype in ACROSS_BUILDS:
            tolerance = dict(ACROSS_BUILDS[a.dtype])
            largest = float(b.abs().nan_to_num(posinf=0.0, neginf=0.0).max()) if b.numel() else 0.0
            tolerance["atol"] *= max(1.0, largest)
            return torch.allclose(a, b, equal_nan=True, **tolerance)
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], across_builds) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same(x, y, across_builds) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b


def _paths(lab: str) -> tuple[Path, Path]:
    return STORED / f"{lab}.pt", STORED_HIDDEN / f"{lab}.pt"


def stored_apart(lab: str) -> tuple[dict, dict]:
    """``lab``'s stored public values and hidden checks' values, apart (empty where a file is
    missing)."""
    public, hidden = _paths(lab)
    return _load(public), _load(hidden)


def out_of_date() -> list[str]:
    """The labs whose stored snapshots differ from what their maker gives (across builds of
    torch: floating-point tensors within :data:`ACROSS_BUILDS`)."""
    return [lab for lab in makers() if not _paths(lab)[0].exists() or not all(
        same(stored, values, across_builds=True)
        for stored, values in zip(stored_apart(lab), made(lab)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labs", nargs="*", help="the labs to rewrite (default: every one)")
    parser.add_argument("--check", action="store_true", help="only say which are out of date")
    args = parser.parse_args(argv)
    unknown = set(args.labs) - set(makers())
    if unknown:
        parser.error(f"no snapshot maker for {sorted(unknown)}: the makers are {makers()}")
    if args.check:
        stale = out_of_date()
        print("snapshots out of date: " + ", ".join(stale) if stale else "snapshots up to date")
        return 1 if stale else 0
    for lab in args.labs or makers():
        for path, values in zip(_paths(lab), made(lab)):
            path.unlink(missing_ok=True)
            if values:
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(values, path)
                print(f"wrote {path.relative_to(REPO)}")
    return 0

