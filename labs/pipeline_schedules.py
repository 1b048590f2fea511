# Student file for the labs, generated from reference_impl/pipeline/pipeline_schedules.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""Pipeline schedules as data: for every rank, the ordered list of passes it runs.

A schedule holds no communication, so one validator, one simulator and one executor serve every
schedule. An :class:`Action` is one pass of one microbatch through one stage: F (forward), B
(backward: the input gradient, or the whole backward when the schedule does not split it) or W
(weight gradient, zero-bubble schedules only); with v chunks per rank, virtual stage s runs on
rank s % p. The generators: :func:`naive`, :func:`gpipe` (Huang et al. 2018),
:func:`one_f_one_b` (PipeDream-flush, Narayanan et al. 2021),
``interleaved.interleaved_one_f_one_b`` (Narayanan et al. 2021, section 2.2.2) and :func:`zb_h1`
(Qi et al. 2023, "Zero Bubble Pipeline Parallelism"); ``named_schedules.build_schedule`` builds
one by name, :func:`schedule_from_strings` one written by hand (``rank 0: F0 F1 B0``).

Lab 4's notebook, sections 1 to 6; the closed forms: ``docs/library.md``, "Validating,
simulating, splitting the backward".
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

KINDS = ("F", "B", "W")
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight-gradient"}


@dataclass(frozen=True)
class Action:
    """One pass: ``kind`` (F, B or W) of ``microbatch`` through virtual ``stage``."""

    kind: str
    microbatch: int
    stage: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}s{self.stage}"

    def describe(self) -> str:
        """E.g. ``B microbatch 3, stage 2``."""
        return f"{self.kind} microbatch {self.microbatch}, stage {self.stage}"


@dataclass(frozen=True)
class Schedule:
    """The passes of every rank, in order: ``actions[rank][step]``."""

    name: str
    ranks: int  # p, the pipeline-parallel size
    microbatches: int  # m
    chunks: int  # v, model chunks (virtual stages) per rank
    split_backward: bool  # True when the backward is split into B and W
    actions: tuple[tuple[Action, ...], ...]

    @property
    def stages(self) -> int:
        """Number of virtual stages, p*v."""
        return self.ranks * self.chunks

    def rank_of(self, stage: int) -> int:
        """The rank that runs virtual ``stage``: ``stage % p`` (Megatron's placement)."""
        if not 0 <= stage < self.stages:
            raise ValueError(f"stage {stage} is out of range: this schedule has {self.stages} "
                             f"stages (0..{self.stages - 1})")
        return stage % self.ranks

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The virtual stages on ``rank``: rank, rank + p, rank + 2p, ..."""
        return tuple(range(rank, self.stages, self.ranks))

    def format(self, rank: int) -> str:
        """``rank``'s actions as text, e.g. ``F0 F1 B0 F2 B1 B2``; ``F3s5`` when v > 1."""
        return " ".join(_token(action, self.chunks) for action in self.actions[rank])

    def __str__(self) -> str:
        header = f"{self.name}: p={self.ranks} ranks, m={self.microbatches} microbatches"
        if self.chunks > 1:
            header += f", v={self.chunks} chunks per rank"
        return "\n".join([header] + [f"rank {rank}: {self.format(rank)}"
                                     for rank in range(self.ranks)])


def _token(action: Action, chunks: int) -> str:
    return f"{action.kind}{action.microbatch}" if chunks == 1 else str(action)


def naive(p: int) -> Schedule:
    """One microbatch: forward through stages 0..p-1, then backward from p-1 to 0."""
    check_counts(ranks=p)
    actions = tuple((Action("F", 0, rank), Action("B", 0, rank)) for rank in range(p))
    return Schedule("naive", p, 1, 1, False, actions)


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2018): every rank runs all m forwards, then all m backwards."""
    check_counts(ranks=p, microbatches=m)
    actions = []
    for rank in range(p):
        raise NotImplementedError('lab4: gpipe (hint: "the GPipe rule" in the notebook)')
    return Schedule("gpipe", p, m, 1, False, tuple(actions))


def one_f_one_b(p: int, m: int) -> Schedule:
    """PipeDream-flush 1F1B (Narayanan et al. 2021).

    Rank r runs a warm-up of forwards, then alternates one forward and one backward, then
    runs the cool-down backwards. Each backward starts as early as the pipeline allows, so
    rank r holds only as many microbatches' activations as its warm-up runs forwards, never
    more than p, instead of GPipe's m.
    """
    check_counts(ranks=p, microbatches=m)
    actions = []
    for rank in range(p):
        raise NotImplementedError('lab4: one_f_one_b (hint: "the 1F1B warm-up" in the notebook)')
    return Schedule("1f1b", p, m, 1, False, tuple(actions))


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1, the handcrafted schedule of Qi et al. 2023, "Zero Bubble Pipeline Parallelism".

    The backward is split into B (gradient of the stage's input, which the previous stage is
    waiting for) and W (gradient of the weights, which nobody waits for). The order of F and B
    is 1F1B's. Activations (or the weight gradients' inputs) are held until W, so every rank
    holds min(p, m) microbatches: 1F1B's peak, which 1F1B reaches on rank 0 only. Rank r
    postpones its first r W passes:
    the B passes travel back to rank 0 sooner, and the postponed W passes fill rank r's
    cool-down, where 1F1B idles. From rank r's (r+1)-th B on, each B is followed by the oldest
    W still waiting (the order of PyTorch's ``ScheduleInterleavedZeroBubble`` with one chunk,
    the paper's ZB-H1 figure). For m >= p and
    T_W <= min(T_F, T_B) (the paper takes them equal) the bubble is (p-1)(T_F + T_B - T_W)
    instead of 1F1B's (p-1)(T_F + T_B + T_W): a third of it when T_F = T_B = T_W.
    """
    actions = []
    for rank, one_f_one_b_row in enumerate(one_f_one_b(p, m).actions):
        ops = []
        waiting_w: deque[int] = deque()  # microbatches whose B ran but whose W has not
        for action in one_f_one_b_row:  # 1F1B's F/B order, with a W after each B from the
            ops.append(action)           # (rank+1)-th on
            if action.kind == "B":
                waiting_w.append(action.microbatch)
                if action.microbatch >= rank:  # the first `rank` W passes are postponed
                    ops.append(Action("W", waiting_w.popleft(), rank))
        ops += [Action("W", i, rank) for i in waiting_w]  # they fill the cool-down
        actions.append(tuple(ops))
    return Schedule("zb-h1", p, m, 1, True, tuple(actions))


_TOKEN = re.compile(r"^([FBW])(\d+)(?:s(\d+))?$")


def schedule_from_strings(rows: list[str], microbatches: int, chunks: int = 1,
                          name: str = "custom", split_backward: bool | None = None) -> Schedule:
    """A schedule written by hand, one string per rank: ``["F0 F1 B0 B1", "F0 B0 F1 B1"]``.

    Each token is a kind and a microbatch, ``F3``; with v > 1 chunks add the virtual stage,
    ``F3s5``. Without a stage the action runs on the rank's own stage (the rank's index), which
    is only possible with one chunk. ``split_backward`` defaults to whether any W appears.
    The result is not checked: pass it to ``pipeline_validator.validate``.
    """
    actions = []
    for rank, row in enumerate(rows):
        ops = []
        for token in row.split():
            match = _TOKEN.match(token)
            if not match:
                raise ValueError(f"rank {rank}: cannot read {token!r}; write a kind (F, B or W) "
                                 f"and a microbatch, e.g. 'F3', or with a stage 'F3s5'")
            kind, microbatch, stage = match.groups()
            if stage is None and chunks > 1:
                raise ValueError(f"rank {rank}: {token!r} needs a stage (e.g. '{token}s{rank}') "
                                 f"because there are {chunks} chunks per rank")
            ops.append(Action(kind, int(microbatch), rank if stage is None else int(stage)))
        actions.append(tuple(ops))
    if split_backward is None:
        split_backward = any(action.kind == "W" for ops in actions for action in ops)
    return Schedule(name, len(rows), microbatches, chunks, split_backward, tuple(actions))


def check_counts(**counts: int) -> None:
    """Refuse a number of ranks, microbatches or chunks that is not an integer >= 1, naming it."""
    labels = {"ranks": "the number of ranks p", "microbatches": "the number of microbatches m",
              "chunks": "the number of chunks per rank v"}
    for key, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{labels[key]} must be an integer >= 1, got {value!r}")
