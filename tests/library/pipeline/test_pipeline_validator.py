"""The schedule validator: broken schedules are refused with a message naming the rank, the
step and the microbatch; deadlocks name the cycle of waiting ranks; and the messages an
executor must send are derived from the actions."""
import pytest

from reference_impl.pipeline import pipeline_validator
from reference_impl.pipeline.interleaved import interleaved_one_f_one_b
from reference_impl.pipeline.named_schedules import SCHEDULES, build_schedule
from reference_impl.pipeline.pipeline_schedules import (
    Schedule, one_f_one_b, schedule_from_strings, zb_h1)
from reference_impl.pipeline.pipeline_messages import (exchange_plan, input_message, messages,
                                                       output_message)
from reference_impl.pipeline.pipeline_validator import ScheduleError, check_rendezvous, validate


def rows(*ranks, m=2, chunks=1):
    return schedule_from_strings(list(ranks), microbatches=m, chunks=chunks)


@pytest.mark.parametrize("schedule, message", [
    (rows("F0 F1 B0", "F0 B0 F1 B1"),
     "rank 0 never runs the backward of microbatch 1 at stage 0"),
    (rows("F0 F1 B0 B1 W0 W1", "F0 B0 F1 B1 W0"),
     "rank 1 never runs the weight-gradient of microbatch 1 at stage 1"),
    (rows("F0 B1 F1 B0", "F0 B0 F1 B1"),
     r"microbatch 1 backward before its forward on rank 0 \(step 1, stage 0\)"),
    (rows("F0 F1 W0 B0 B1 W1", "F0 B0 W0 F1 B1 W1"),
     r"microbatch 0 weight-gradient before its backward on rank 0 \(step 2, stage 0\)"),
    (rows("F0 F1 B0 B1 F0", "F0 B0 F1 B1"),
     r"rank 0, step 4 \(F microbatch 0, stage 0\): microbatch 0 forward at stage 0 runs twice "
     r"\(first at step 0\)"),
    (schedule_from_strings(["F0 F1 B0 B1", "F0 B0 F1 B1 W1"], 2, split_backward=False),
     r"rank 1, step 4 \(W microbatch 1, stage 1\): unknown kind 'W', expected one of F, B "
     r"\(this schedule does not split the backward\)"),
    (rows("F0 F2 B0 B2", "F0 B0 F1 B1"),
     r"rank 0, step 1 \(F microbatch 2, stage 0\): microbatch 2 is out of range \(0..1\)"),
    (rows("F0 F1 B0 B1", "F0s0 B0s1 F1s1 B1s1"),
     r"rank 1, step 0 \(F microbatch 0, stage 0\): stage 0 runs on rank 0, not rank 1"),
    # one rank, two stages: the stages' own order is checked on the rank
    (rows("F0s1 F0s0 B0s1 B0s0", m=1, chunks=2),
     r"microbatch 0 forward at stage 1 before its forward at stage 0 on rank 0 \(step 0"),
    (rows("F0s0 F0s1 B0s0 B0s1", m=1, chunks=2),
     r"microbatch 0 backward at stage 0 before its backward at stage 1 on rank 0 \(step 2"),
    (Schedule("short", 3, 1, 1, False, ((),)), "for 3 ranks but lists actions for 1"),
])
def test_broken_schedules_are_named(schedule, message):
    with pytest.raises(ScheduleError, match=message):
        validate(schedule)


def test_crossed_send_and_receive_is_a_deadlock():
    # rank 0 waits for microbatch 0's gradient before sending microbatch 1's activation;
    # rank 1 waits for that activation before it computes the gradient.
    schedule = rows("F0 B0 F1 B1", "F0 F1 B0 B1")
    with pytest.raises(ScheduleError) as caught:
        validate(schedule)
    assert str(caught.value) == (
        "deadlock: rank 0 waits at step 1 (B microbatch 0, stage 0) for the gradient from "
        "rank 1, which is itself waiting at step 1 (F microbatch 1, stage 1) for the "
        "activation from rank 0")


def test_a_deadlock_across_three_ranks_names_the_whole_cycle():
    # v = 2 chunks on 3 ranks: stage 2 (rank 2) feeds stage 3 (rank 0). Rank 1 wants
    # microbatch 1 first, which rank 0 only sends after stage 3 got microbatch 0 around the loop.
    schedule = rows("F0s0 F0s3 F1s0 F1s3 B0s3 B0s0 B1s3 B1s0",
                    "F1s1 F0s1 F0s4 F1s4 B0s4 B0s1 B1s4 B1s1",
                    "F0s2 F1s2 F0s5 B0s5 F1s5 B1s5 B0s2 B1s2", chunks=2)
    with pytest.raises(ScheduleError) as caught:
        validate(schedule)
    assert str(caught.value) == (
        "deadlock: rank 0 waits at step 1 (F microbatch 0, stage 3) for the activation from "
        "rank 2, which is itself waiting at step 0 (F microbatch 0, stage 2) for the "
        "activation from rank 1, which is itself waiting at step 0 (F microbatch 1, stage 1) "
        "for the activation from rank 0")


def test_messages_out_of_order_on_a_link_pass_by_tag_but_not_in_order():
    # rank 1 receives microbatch 1 before microbatch 0: fine when messages carry tags (gloo),
    # wrong when a backend matches them in the order they were sent (NCCL).
    schedule = rows("F0 F1 B1 B0", "F1 F0 B1 B0")
    validate(schedule)
    with pytest.raises(ScheduleError, match=(
            r"rank 0 sends the activation of microbatch 0 from stage 0 \(rank 0\) to stage 1 "
            r"\(rank 1\) as message 0 on the link to rank 1, but rank 1 receives the activation "
            r"of microbatch 1")):
        validate(schedule, in_order=True)


def test_valid_schedules_pass():
    assert validate(one_f_one_b(4, 8)) is None
    validate(rows("F0 F1 B0 B1", "F1 F0 B0 B1"))  # any order a rank's inputs allow
    validate(rows("F0s0 F0s1 B0s1 B0s0", m=1, chunks=2))


def test_messages_are_derived_from_the_actions():
    schedule = one_f_one_b(2, 1)
    (rank0, rank1) = messages(schedule)
    assert [(t.op, t.step, t.message.kind, t.message.src, t.message.dst) for t in rank0] == [
        ("send", 0, "activation", 0, 1), ("recv", 1, "gradient", 1, 0)]
    assert [(t.op, t.step, t.message.kind) for t in rank1] == [
        ("recv", 0, "activation"), ("send", 1, "gradient")]
    forward = schedule.actions[0][0]
    assert output_message(schedule, forward) == input_message(schedule, schedule.actions[1][0])
    assert input_message(schedule, forward) is None  # the first stage reads the data


@pytest.mark.parametrize("schedule", [one_f_one_b(4, 8), zb_h1(3, 5),
                                      interleaved_one_f_one_b(2, 4, 3), one_f_one_b(1, 3),
                                      interleaved_one_f_one_b(1, 2, 2)])
def test_every_send_has_one_matching_receive(schedule):
    sent, received = [], []
    for rank, transfers in enumerate(messages(schedule)):
        for transfer in transfers:
            mine = transfer.message.src if transfer.op == "send" else transfer.message.dst
            assert mine == rank
            (sent if transfer.op == "send" else received).append(transfer.message)
    assert sorted(sent, key=lambda m: m.tag) == sorted(received, key=lambda m: m.tag)
    assert len({message.tag for message in sent}) == len(sent)
    # v chunks: a microbatch crosses p*v - 1 stage boundaries each way, all between ranks
    # when p > 1, none when p = 1
    boundaries = schedule.stages - 1 if schedule.ranks > 1 else 0
    assert len(sent) == 2 * boundaries * schedule.microbatches


# ---------------------------------------------- rendezvous sends (NCCL), the executor's plan

def every_schedule():
    """Every schedule for p in {2, 4, 8} and m in {1, p, 2p, p+1}, where it is defined."""
    for name in SCHEDULES:
        for p in (2, 4, 8):
            for m in sorted({1, p, 2 * p, p + 1}):
                for chunks in ((1, 2) if name == "interleaved" else (1,)):
                    try:
                        yield build_schedule(name, p, m, chunks)
                    except ValueError:  # e.g. naive needs m = 1, interleaved m % p == 0
                        continue


def test_the_executor_s_plan_cannot_deadlock_with_rendezvous_sends():
    checked = 0
    for schedule in every_schedule():
        plan = exchange_plan(schedule)
        check_rendezvous(schedule, plan)
        sent = [m for exchanges in plan for e in exchanges for m in e.sends]
        received = [m for exchanges in plan for e in exchanges for m in e.receives]
        assert sorted(sent, key=str) == sorted(received, key=str) == sorted(
            (t.message for transfers in messages(schedule) for t in transfers
             if t.op == "send"), key=str)
        checked += 1
    assert checked >= 40


def test_each_send_goes_with_the_next_receive():
    plan = exchange_plan(one_f_one_b(2, 4))
    steady = [e for e in plan[0] if e.sends and e.receives]
    assert steady and all(len(e.sends) <= 1 for e in plan[0])
    assert "send activation of microbatch 1 to rank 1 + receive gradient of microbatch 0" in \
        steady[0].describe()


def test_interleaved_posts_some_receives_early():
    plan = exchange_plan(interleaved_one_f_one_b(2, 4, 2))
    assert any(len(e.receives) > 1 for exchanges in plan for e in exchanges)


def test_sends_and_receives_posted_alone_deadlock_1f1b_under_rendezvous():
    schedule = one_f_one_b(2, 4)
    validate(schedule)  # fine where sends are buffered (gloo)
    with pytest.raises(ScheduleError, match=r"deadlock with rendezvous sends \(NCCL\): rank 0 "
                       r"before step 2 cannot send the activation of microbatch 1 until rank 1 "
                       r"posts its match, while rank 1 before step 2 cannot send the gradient "
                       r"of microbatch 0"):
        check_rendezvous(schedule, exchange_plan(schedule, paired=False))


def test_validate_checks_rendezvous_when_asked(monkeypatch):
    schedule = interleaved_one_f_one_b(4, 8, 2)
    validate(schedule, in_order=True, rendezvous=True)  # the executor's plan holds up
    checked = []
    monkeypatch.setattr(pipeline_validator, "check_rendezvous",
                        lambda schedule, plan=None: checked.append(schedule.name))
    validate(schedule, in_order=True)
    assert checked == [], "validate checked rendezvous sends without being asked"
    validate(schedule, in_order=True, rendezvous=True)
    assert checked == [schedule.name], "validate(rendezvous=True) did not check rendezvous sends"
