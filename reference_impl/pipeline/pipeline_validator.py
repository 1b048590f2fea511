"""Check a pipeline schedule with no communication at all: complete, ordered, deadlock-free.

:func:`validate` checks completeness, the order on each rank, and deadlock with buffered sends
(optionally the order on each link, ``in_order=True``, and the executor's exchange plan with
NCCL's rendezvous sends, ``rendezvous=True`` / :func:`check_rendezvous`), and raises
:class:`ScheduleError` naming the first problem's rank, step (from 0) and microbatch. The
checks in full: docs/library.md, 'Validating, simulating, splitting the backward'.
"""
from __future__ import annotations

from reference_impl.pipeline.pipeline_messages import (Exchange, Message, exchange_plan,
                                                       input_message, messages, normalized,
                                                       output_message, run_exchanges)
from reference_impl.pipeline.pipeline_schedules import KIND_NAMES, KINDS, Action, Schedule


class ScheduleError(ValueError):
    """A schedule is incomplete, out of order, or deadlocks."""


def check_rendezvous(schedule: Schedule, plan=None) -> None:
    """Raise :class:`ScheduleError` if ``plan`` (default: :func:`exchange_plan`) jams when a
    send completes only once the receiver has posted its receive, and each rank waits for the
    whole of one exchange before it moves on."""
    schedule = normalized(schedule)
    plan = exchange_plan(schedule) if plan is None else plan
    position, done = run_exchanges(plan)

    def current(rank: int) -> Exchange | None:
        return plan[rank][position[rank]] if position[rank] < len(plan[rank]) else None

    def unmatched(rank: int) -> tuple[str, Message, int]:
        """What holds ``rank``'s exchange: (what, message, the rank that must post its match)."""
        exchange = current(rank)
        return ([("send", m, m.dst) for m in exchange.sends if m not in done]
                + [("receive", m, m.src) for m in exchange.receives if m not in done])[0]

    blocked = [rank for rank in range(len(plan)) if current(rank) is not None]
    if not blocked:
        return
    chain, rank = [], blocked[0]
    while rank not in chain and current(rank) is not None:
        chain.append(rank)
        rank = unmatched(rank)[2]
    parts = []
    for index, member in enumerate(chain[chain.index(rank):] if rank in chain else chain):
        what, message, peer = unmatched(member)
        step = current(member).step
        before = (f"before step {step}" if step < len(schedule.actions[member])
                  else "after its last step")
        prefix = f"rank {member}" if index == 0 else "while rank " + str(member)
        parts.append(f"{prefix} {before} cannot {what} the {message.kind} of microbatch "
                     f"{message.microbatch} until rank {peer} posts its match")
    if rank not in chain:
        parts.append(f"which rank {rank} never does: it has finished")
    raise ScheduleError("deadlock with rendezvous sends (NCCL): " + ", ".join(parts))


def validate(schedule: Schedule, in_order: bool = False, rendezvous: bool = False) -> None:
    """Raise :class:`ScheduleError` for the first problem found, or return None."""
    schedule = normalized(schedule)
    _check_shape(schedule)
    _check_complete(schedule)
    _check_order_on_each_rank(schedule)
    _check_no_deadlock(schedule)
    if in_order:
        _check_links_in_order(schedule)
    if rendezvous:
        check_rendezvous(schedule)


def _where(rank: int, step: int, action: Action) -> str:
    return f"rank {rank}, step {step} ({action.describe()})"


def _check_shape(schedule: Schedule) -> None:
    for label, value in (("ranks", schedule.ranks), ("microbatches", schedule.microbatches),
                         ("chunks", schedule.chunks)):
        if not isinstance(value, int) or value < 1:
            raise ScheduleError(f"the number of {label} must be an integer >= 1, got {value!r}")
    if len(schedule.actions) != schedule.ranks:
        raise ScheduleError(f"the schedule is for {schedule.ranks} ranks but lists actions for "
                            f"{len(schedule.actions)}")


def _check_complete(schedule: Schedule) -> None:
    kinds = KINDS if schedule.split_backward else ("F", "B")
    seen: dict[Action, tuple[int, int]] = {}
    for rank, ops in enumerate(schedule.actions):
        for step, action in enumerate(ops):
            where = _where(rank, step, action)
            if action.kind not in kinds:
                hint = (" (this schedule does not split the backward)" if action.kind == "W"
                        else "")
                raise ScheduleError(f"{where}: unknown kind {action.kind!r}, expected one of "
                                    f"{', '.join(kinds)}{hint}")
            if not 0 <= action.microbatch < schedule.microbatches:
                raise ScheduleError(f"{where}: microbatch {action.microbatch} is out of range "
                                    f"(0..{schedule.microbatches - 1})")
            if not 0 <= action.stage < schedule.stages:
                raise ScheduleError(f"{where}: stage {action.stage} is out of range "
                                    f"(0..{schedule.stages - 1})")
            if schedule.rank_of(action.stage) != rank:
                raise ScheduleError(f"{where}: stage {action.stage} runs on rank "
                                    f"{schedule.rank_of(action.stage)}, not rank {rank}")
            if action in seen:
                raise ScheduleError(f"{where}: microbatch {action.microbatch} "
                                    f"{KIND_NAMES[action.kind]} at stage {action.stage} runs "
                                    f"twice (first at step {seen[action][1]})")
            seen[action] = (rank, step)
    for stage in range(schedule.stages):
        for microbatch in range(schedule.microbatches):
            for kind in kinds:
                if Action(kind, microbatch, stage) not in seen:
                    raise ScheduleError(
                        f"rank {schedule.rank_of(stage)} never runs the {KIND_NAMES[kind]} of "
                        f"microbatch {microbatch} at stage {stage}")


def _check_order_on_each_rank(schedule: Schedule) -> None:
    last = schedule.stages - 1
    for rank, ops in enumerate(schedule.actions):
        done: set[Action] = set()
        for step, action in enumerate(ops):
            kind, mb, s = action.kind, action.microbatch, action.stage
            where = f"on rank {rank} (step {step}, stage {s})"
            if kind == "F" and s > 0 and schedule.rank_of(s - 1) == rank \
                    and Action("F", mb, s - 1) not in done:
                raise ScheduleError(f"microbatch {mb} forward at stage {s} before its forward "
                                    f"at stage {s - 1} {where}")
            if kind == "B" and Action("F", mb, s) not in done:
                raise ScheduleError(f"microbatch {mb} backward before its forward {where}")
            if kind == "B" and s < last and schedule.rank_of(s + 1) == rank \
                    and Action("B", mb, s + 1) not in done:
                raise ScheduleError(f"microbatch {mb} backward at stage {s} before its "
                                    f"backward at stage {s + 1} {where}")
            if kind == "W" and Action("B", mb, s) not in done:
                raise ScheduleError(f"microbatch {mb} weight-gradient before its backward "
                                    f"{where}")
            done.add(action)


def _check_no_deadlock(schedule: Schedule) -> None:
    """Run every rank as far as its messages allow; if all are stuck, report the cycle."""
    sent: set[Message] = set()
    position = [0] * schedule.ranks
    moved = True
    while moved:
        moved = False
        for rank, ops in enumerate(schedule.actions):
            while position[rank] < len(ops):
                action = ops[position[rank]]
                needed = input_message(schedule, action)
                if needed is not None and needed not in sent:
                    break
                produced = output_message(schedule, action)
                if produced is not None:
                    sent.add(produced)
                position[rank] += 1
                moved = True
    blocked = [rank for rank, ops in enumerate(schedule.actions) if position[rank] < len(ops)]
    if not blocked:
        return

    def waiting(rank: int) -> tuple[str, Message]:
        action = schedule.actions[rank][position[rank]]
        needed = input_message(schedule, action)
        return f"at step {position[rank]} ({action.describe()})", needed

    # Every message a blocked rank waits for is sent by a rank that is blocked before sending
    # it (the schedule is complete), so following the waits from any blocked rank closes a cycle.
    chain, rank = [], blocked[0]
    while rank not in chain:
        chain.append(rank)
        rank = waiting(rank)[1].src
    cycle = chain[chain.index(rank):]
    parts = []
    for index, member in enumerate(cycle):
        at, needed = waiting(member)
        prefix = f"rank {member} waits" if index == 0 else "which is itself waiting"
        parts.append(f"{prefix} {at} for the {needed.kind} from rank {needed.src}")
    raise ScheduleError("deadlock: " + ", ".join(parts))


def _check_links_in_order(schedule: Schedule) -> None:
    sends: dict[tuple[int, int], list[Message]] = {}
    receives: dict[tuple[int, int], list[Message]] = {}
    for transfers in messages(schedule):
        for transfer in transfers:
            link = (transfer.message.src, transfer.message.dst)
            (sends if transfer.op == "send" else receives).setdefault(link, []).append(
                transfer.message)
    for (src, dst), sent in sorted(sends.items()):
        for index, (out, into) in enumerate(zip(sent, receives[(src, dst)])):
            if out != into:
                raise ScheduleError(
                    f"rank {src} sends {out.describe()} as message {index} on the link to "
                    f"rank {dst}, but rank {dst} receives {into.describe()} there: a backend "
                    f"that matches messages by order (NCCL) would deliver the wrong tensor")
