"""Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters", section 2.2.2): each rank holds v model chunks, so filling and draining the
pipeline costs 1/v as much, for v times more point-to-point messages.

A schedule as data like those of ``pipeline_schedules`` (same ``Action`` and ``Schedule``),
served by the same validator, simulator and executor; with v = 1 it is 1F1B.
"""
from __future__ import annotations

from dataclasses import replace

from reference_impl.pipeline.pipeline_schedules import Action, Schedule, check_counts, one_f_one_b


def interleaved_one_f_one_b(p: int, m: int, v: int = 2) -> Schedule:
    """Interleaved 1F1B with v model chunks per rank (Narayanan et al. 2021, section 2.2.2).

    Stage s (of p*v) runs on rank s % p. Every rank runs its m*v forwards in the same order:
    groups of p microbatches, each group through chunk 0, then chunk 1, ..., then the next
    group. The k-th forward of a rank is

        chunk      (k // p) % v
        microbatch (k // (p*v)) * p + k % p

    and the k-th backward is the same with the chunks reversed (v - 1 first). Rank r warms up
    with ``(v - 1)*p + 2*(p - r - 1)`` forwards (capped at m*v), then alternates one forward
    and one backward, then runs the cool-down backwards (Megatron-LM's warm-up count). The
    ``(v - 1)*p`` term lets the first group of microbatches reach the last chunk.

    The group size is p here, as in PyTorch's ``ScheduleInterleaved1F1B``. Megatron-LM names
    it ``microbatch_group_size_per_vp_stage`` (p by default) and accepts any group size of at
    least p, with the same warm-up formula in the group size; groups of p keep the schedule
    simplest, and need m to be a multiple of p.

    With v = 1 this is exactly :func:`one_f_one_b` (Megatron then uses its non-interleaved
    schedule).
    """
    check_counts(ranks=p, microbatches=m, chunks=v)
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the number of microbatches ({m}) to be a "
                         f"multiple of the pipeline size ({p})")
    if v == 1:
        return replace(one_f_one_b(p, m), name="interleaved")
    total = m * v  # passes of each kind on every rank

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        """(microbatch, chunk) of a rank's k-th forward or backward."""
        chunk = (k // p) % v
        return (k // (p * v)) * p + k % p, chunk if forward else v - 1 - chunk

    def action(kind: str, k: int, rank: int) -> Action:
        microbatch, chunk = virtual(k, kind == "F")
        return Action(kind, microbatch, chunk * p + rank)

    actions = []
    for rank in range(p):
        warmup = min((v - 1) * p + 2 * (p - rank - 1), total)
        ops = [action("F", k, rank) for k in range(warmup)]
        for k in range(total - warmup):
            ops += [action("F", warmup + k, rank), action("B", k, rank)]
        ops += [action("B", k, rank) for k in range(total - warmup, total)]
        actions.append(tuple(ops))
    return Schedule("interleaved", p, m, v, False, tuple(actions))
