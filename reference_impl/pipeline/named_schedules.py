"""Every schedule by its name, as a command line or a trainer's configuration names it: the
generators of ``pipeline_schedules`` and ``interleaved``, and :func:`build_schedule`, which
checks that p, m and v suit the one named.
"""
from __future__ import annotations

from reference_impl.pipeline.interleaved import interleaved_one_f_one_b
from reference_impl.pipeline.pipeline_schedules import Schedule, gpipe, naive, one_f_one_b, zb_h1

SCHEDULES = {
    "naive": naive,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved_one_f_one_b,
    "zb-h1": zb_h1,
}


def build_schedule(name: str, p: int, m: int = 1, v: int = 1) -> Schedule:
    """The schedule ``name`` from :data:`SCHEDULES` for p ranks, m microbatches, v chunks."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if name == "interleaved":
        return interleaved_one_f_one_b(p, m, v)
    if v != 1:
        raise ValueError(f"schedule {name!r} has one chunk per rank, got v={v}; "
                         f"use 'interleaved' for v > 1")
    if name == "naive":
        if m != 1:
            raise ValueError(f"the naive schedule runs a single microbatch, got m={m}; "
                             f"use 'gpipe' or '1f1b' for m > 1")
        return naive(p)
    return SCHEDULES[name](p, m)
