"""The communication a pipeline schedule implies: its messages, and how an executor groups them.

:func:`input_message`, :func:`output_message` and :func:`messages`: per rank and in order, the
sends and receives the actions imply. :func:`exchange_plan` posts each step's send and receive
together (one ``batch_isend_irecv``), as Megatron-LM, picotron and PyTorch do, because on NCCL
posting them alone deadlocks 1F1B at p = 2; :func:`run_exchanges` runs the ranks through it with
rendezvous sends. Why: docs/library.md, 'Validating, simulating, splitting the backward'.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.pipeline.pipeline_schedules import Action, Schedule


@dataclass(frozen=True)
class Message:
    """An activation (forward) or a gradient (backward) of one microbatch between two stages."""

    kind: str  # "activation" or "gradient"
    microbatch: int
    src_stage: int
    dst_stage: int
    src: int  # the sending rank
    dst: int  # the receiving rank
    tag: int  # unique within a schedule: usable as a send/recv tag (gloo)

    def describe(self) -> str:
        return (f"the {self.kind} of microbatch {self.microbatch} from stage {self.src_stage} "
                f"(rank {self.src}) to stage {self.dst_stage} (rank {self.dst})")


@dataclass(frozen=True)
class Transfer:
    """One point-to-point operation of a rank: ``op`` is "recv" (posted before the action at
    ``step``, which needs it) or "send" (posted after the action at ``step`` produced it)."""

    op: str
    step: int
    message: Message


def _message(schedule: Schedule, kind: str, microbatch: int, src_stage: int,
             dst_stage: int) -> Message | None:
    """The message from ``src_stage`` to ``dst_stage``, or None when both are on one rank."""
    src, dst = schedule.rank_of(src_stage), schedule.rank_of(dst_stage)
    if src == dst:
        return None
    tag = 2 * (microbatch * schedule.stages + dst_stage) + (kind == "gradient")
    return Message(kind, microbatch, src_stage, dst_stage, src, dst, tag)


def input_message(schedule: Schedule, action: Action) -> Message | None:
    """What ``action`` must receive before it runs: the activation from stage s-1 for an F,
    the gradient from stage s+1 for a B; None for W, the first forward, the last backward,
    and when the neighbouring stage is on the same rank."""
    s, mb = action.stage, action.microbatch
    if action.kind == "F" and s > 0:
        return _message(schedule, "activation", mb, s - 1, s)
    if action.kind == "B" and s < schedule.stages - 1:
        return _message(schedule, "gradient", mb, s + 1, s)
    return None


def output_message(schedule: Schedule, action: Action) -> Message | None:
    """What ``action`` sends when it is done: the activation to stage s+1 after an F, the
    gradient to stage s-1 after a B; None otherwise."""
    s, mb = action.stage, action.microbatch
    if action.kind == "F" and s < schedule.stages - 1:
        return _message(schedule, "activation", mb, s, s + 1)
    if action.kind == "B" and s > 0:
        return _message(schedule, "gradient", mb, s, s - 1)
    return None


def messages(schedule: Schedule) -> tuple[tuple[Transfer, ...], ...]:
    """Per rank, in order: for each step, the receive its action needs, then the send it makes."""
    result = []
    for ops in schedule.actions:
        transfers = []
        for step, action in enumerate(ops):
            needed, produced = input_message(schedule, action), output_message(schedule, action)
            if needed is not None:
                transfers.append(Transfer("recv", step, needed))
            if produced is not None:
                transfers.append(Transfer("send", step, produced))
        result.append(tuple(transfers))
    return tuple(result)


def normalized(schedule: Schedule) -> Schedule:
    """``schedule`` rebuilt from this kit's own ``Action`` and ``Schedule`` classes.

    A student's ``labs/pipeline_schedules.py`` defines classes of the same names, and
    dataclasses compare equal only within one class, so its actions would never match the ones
    the checks build. Rebuilding field by field lets every checker take either.
    """
    if type(schedule) is Schedule and all(type(action) is Action
                                          for ops in schedule.actions for action in ops):
        return schedule
    return Schedule(schedule.name, schedule.ranks, schedule.microbatches, schedule.chunks,
                    schedule.split_backward,
                    tuple(tuple(Action(action.kind, action.microbatch, action.stage)
                                for action in ops) for ops in schedule.actions))


@dataclass(frozen=True)
class Exchange:
    """The point-to-point messages a rank posts together, and waits for, before the action at
    ``step`` (``step`` = the number of actions: after the last one)."""

    step: int
    sends: tuple[Message, ...]
    receives: tuple[Message, ...]

    def describe(self) -> str:
        parts = [f"send {m.kind} of microbatch {m.microbatch} to rank {m.dst}" for m in self.sends]
        parts += [f"receive {m.kind} of microbatch {m.microbatch} from rank {m.src}"
                  for m in self.receives]
        return " + ".join(parts)


def exchange_plan(schedule: Schedule, paired: bool = True) -> tuple[tuple[Exchange, ...], ...]:
    """Per rank, in order, the exchanges an executor posts (empty ones left out).

    ``paired=True`` (what the executor does): before each action, the send of the previous
    action's output together with the receive of this action's input. Where that would still
    jam (interleaved 1F1B at m = 2p: two ranks each send a gradient the other receives only
    one action later), the receive a blocked send waits for is posted early, in the
    receiver's current exchange: a receive can always be posted ahead (its buffer is made
    then), a send never (its tensor does not exist yet). Megatron-LM's interleaved schedule
    posts its next receives with the current sends for the same reason.

    ``paired=False``: every send and every receive on its own, in the order the actions
    produce and need them (the naive executor, which deadlocks under rendezvous sends)."""
    schedule = normalized(schedule)
    plan = []
    for ops in schedule.actions:
        exchanges = []
        for step in range(len(ops) + 1):
            sent = output_message(schedule, ops[step - 1]) if step > 0 else None
            needed = input_message(schedule, ops[step]) if step < len(ops) else None
            sends, receives = tuple(m for m in (sent,) if m), tuple(m for m in (needed,) if m)
            if paired and (sends or receives):
                exchanges.append(Exchange(step, sends, receives))
            elif not paired:
                exchanges += [Exchange(step, (m,), ()) for m in sends]
                exchanges += [Exchange(step, (), (m,)) for m in receives]
        plan.append(exchanges)
    if paired:
        _post_receives_early_where_needed(plan)
    return tuple(tuple(e for e in exchanges if e.sends or e.receives) for exchanges in plan)


def _post_receives_early_where_needed(plan: list[list[Exchange]]) -> None:
    while True:
        position, done = run_exchanges(plan)
        moved = False
        for rank, exchanges in enumerate(plan):
            if position[rank] == len(exchanges):
                continue
            for message in exchanges[position[rank]].sends:
                receiver, at = message.dst, position[message.dst]
                later = next((i for i in range(at + 1, len(plan[receiver]))
                              if message in plan[receiver][i].receives), None)
                if message in done or later is None:
                    continue
                source, target = plan[receiver][later], plan[receiver][at]
                plan[receiver][later] = Exchange(source.step, source.sends, tuple(
                    m for m in source.receives if m != message))
                plan[receiver][at] = Exchange(target.step, target.sends,
                                              target.receives + (message,))
                moved = True
        if not moved:
            return


def run_exchanges(plan) -> tuple[list[int], set[Message]]:
    """Advance every rank through its exchanges with rendezvous sends: a message is done when
    its sender and its receiver have both posted it; a rank moves on when its whole exchange
    is done. Returns where each rank stopped, and the messages done."""
    position, done = [0] * len(plan), set()

    def current(rank: int) -> Exchange | None:
        return plan[rank][position[rank]] if position[rank] < len(plan[rank]) else None

    moved = True
    while moved:
        posted_receives = {m for rank in range(len(plan)) if current(rank) is not None
                           for m in current(rank).receives}
        done |= {m for rank in range(len(plan)) if current(rank) is not None
                 for m in current(rank).sends if m in posted_receives}
        ready = [rank for rank in range(len(plan)) if current(rank) is not None
                 and set(current(rank).sends + current(rank).receives) <= done]
        for rank in ready:
            position[rank] += 1
        moved = bool(ready)
    return position, done
