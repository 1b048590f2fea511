"""Check a pipeline schedule with no communication at all: complete, ordered, deadlock-free.

:func:`validate` runs three checks, in this order, and raises :class:`ScheduleError` naming
the first problem (its rank, its step, its microbatch):

1. **Completeness.** Every microbatch has exactly one F and one B (and one W when the schedule
   splits the backward) at every stage, on the rank that holds the stage (stage s on rank
   s % p).
2. **Order on one rank.** A B after its own F, a W after its B, and when two neighbouring
   stages share a rank (one rank, or v > 1 chunks) the forward of stage s after that of s-1
   and the backward of stage s after that of s+1.
3. **No deadlock.** Across ranks the order is enforced by messages: the F of stage s needs the
   activation from stage s-1, the B of stage s the gradient from stage s+1 (see
   :func:`input_message`). The check executes the ranks step by step with *blocking receives*
   and *buffered sends* (each send is posted as ``isend`` and never waits for the receiver):
   a rank stops at its next action until the message it needs has been sent. If no rank can
   move while some still have actions, it reports the cycle of waiting ranks.

Steps are counted from 0: step i of rank r is ``schedule.actions[r][i]``.

:func:`messages` lists, per rank and in order, the sends and receives the actions imply: what
an executor posts around each action. With ``in_order=True``, :func:`validate` also checks that
on every link (sender, receiver) the messages are received in the order they are sent, which
a backend that matches point-to-point messages by order instead of by tag (NCCL) needs.

**Rendezvous sends.** The deadlock check above lets a send finish without its receiver, as
gloo's buffered sends do. On NCCL a send larger than its buffer waits until the receiver has
posted the matching receive, and operations to one peer run in order. Under that model the
naive executor (each send and each receive posted alone) deadlocks 1F1B at p = 2: in the
steady state rank 0 sends an activation while rank 1 sends a gradient, and neither has posted
the receive the other's send needs. Megatron-LM (``send_forward_recv_backward``), picotron and
PyTorch's pipelining all post a step's send and receive *together*. :func:`exchange_plan`
is that plan, per rank: before each action, one :class:`Exchange` holding the send of the
previous action's output and the receive of this action's input, posted as one batch
(``batch_isend_irecv``) and waited for as a whole; :func:`check_rendezvous` runs the ranks
through their exchanges with rendezvous sends and reports the cycle if they jam.
``validate(schedule, rendezvous=True)`` adds it; the executor runs exactly this plan. (It
waits for less: for an exchange's receives before it computes, for the sends at the end of
the step. Waiting less only lets a rank post its later operations sooner, in the same order
per link, so a plan that passes with whole exchanges waited for passes with that too.)
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.pipeline.pipeline_schedules import KIND_NAMES, KINDS, Action, Schedule


class ScheduleError(ValueError):
    """A schedule is incomplete, out of order, or deadlocks."""


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
        position, done = _run_exchanges(plan)
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


def _run_exchanges(plan) -> tuple[list[int], set[Message]]:
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


def check_rendezvous(schedule: Schedule, plan=None) -> None:
    """Raise :class:`ScheduleError` if ``plan`` (default: :func:`exchange_plan`) jams when a
    send completes only once the receiver has posted its receive, and each rank waits for the
    whole of one exchange before it moves on."""
    schedule = normalized(schedule)
    plan = exchange_plan(schedule) if plan is None else plan
    position, done = _run_exchanges(plan)

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
