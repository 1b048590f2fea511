"""Lab 4, graded: the student's ``gpipe`` and ``one_f_one_b`` schedules, checked as data, with
no communication: valid (complete, ordered, deadlock-free, every link in order) for every
p = 1..5 and m = 1..9; the exact per-rank order on small cases; and, simulated with
T_F = 1 and T_B = 2, the bubble fraction and the makespan (the least the pipeline allows, as the
notebook's Exercise 2 derives them) and the activations each rank holds (m for GPipe; for 1F1B,
the numbers the reference's schedules give).

The expected orders, 1F1B's warm-up forwards and its peaks are read from lab 4's snapshot
(``reference_impl.course.snapshots``): the handout holds the numbers, never the rule that gives
them, which the lab has the student derive; a failure shows the student's own order.

The student's generators run in a helper process and their schedules come back as data
(each rank's (kind, microbatch, stage) triples); here they are rebuilt with the kit's classes
(``pipeline_messages.normalized``), then validated and simulated by the kit.
"""
from types import SimpleNamespace

import pytest

from reference_impl.course.snapshots import snapshot
from reference_impl.pipeline.pipeline_messages import normalized
from reference_impl.pipeline.pipeline_simulator import simulate
from reference_impl.pipeline.pipeline_validator import ScheduleError, validate

pytestmark = pytest.mark.lab4

SIZES = [(p, m) for p in range(1, 6) for m in range(1, 10)]

HINTS = {
    "gpipe": "GPipe: every rank runs every microbatch's forward, in order, before any backward, "
             "all at its own stage r (Action(kind, microbatch, stage=r))",
    "one_f_one_b": "1F1B: each backward as early as the pipeline allows, and no forward more "
                   "before it than keeps the rank busy until the first gradient reaches it: how "
                   "many is that for rank r of p, and with only m microbatches? Between the "
                   "first and the last backward, forwards and backwards alternate, the backward "
                   "always of the oldest microbatch; every action at stage r",
}


def warm_up_note(schedule, generator, p, m):
    """For 1F1B: the first rank that runs another number of forwards before its first
    backward than the reference's (its warm-up and the first steady-state forward), or ''."""
    if generator != "one_f_one_b":
        return ""
    for rank in range(len(schedule.actions)):
        beyond = sorted({a.microbatch for a in schedule.actions[rank] if not 0 <= a.microbatch < m})
        if beyond:
            return (f"\n1F1B's warm-up not capped at m: rank {rank} runs microbatch(es) {beyond}, "
                    f"which do not exist for m={m}: with fewer microbatches than the pipeline "
                    f"could hold, how many forwards can a rank run before its first backward?")
    for rank in range(len(schedule.actions)):
        kinds = [action.kind for action in schedule.actions[rank]]
        before = kinds.index("B") if "B" in kinds else len(kinds)
        recorded = snapshot("lab4", "warm_up").get(f"{p}/{m}")
        if recorded is None:  # recorded for the sizes whose orders and peaks are compared only
            return ""
        expected = recorded[rank]
        if before != expected:
            what = "warm-up off by one" if abs(before - expected) == 1 else "warm-up wrong"
            more = "one" if abs(before - expected) == 1 else "more than one"
            return (f"\n1F1B's {what}: rank {rank} runs {before} forward(s) before its first "
                    f"backward, {more} {'too many' if before > expected else 'too few'} for "
                    f"p={p}, m={m}: when does the first gradient reach rank {rank}?")
    return ""


ORDERED = [("gpipe", 1, 3), ("gpipe", 2, 3), ("gpipe", 3, 2), ("one_f_one_b", 1, 3),
           ("one_f_one_b", 2, 3), ("one_f_one_b", 3, 4), ("one_f_one_b", 4, 2),
           ("one_f_one_b", 4, 5)]  # the sizes whose order lab 4's snapshot records


def schedules_as_data(impl, generator, sizes):
    """``generator(p, m)`` of the student's module for every (p, m), as data; or the reason
    a returned value is not a Schedule of per-rank Actions."""
    make = getattr(impl.module("pipeline_schedules"), generator)
    found = []
    for p, m in sizes:
        schedule = make(p, m)
        try:
            found.append({"name": str(schedule.name), "ranks": int(schedule.ranks),
                          "microbatches": int(schedule.microbatches),
                          "chunks": int(schedule.chunks),
                          "split_backward": bool(schedule.split_backward),
                          "actions": [[(str(a.kind), int(a.microbatch), int(a.stage)) for a in ops]
                                      for ops in schedule.actions]})
        except (AttributeError, TypeError, ValueError) as error:
            found.append(f"{type(error).__name__}: {error}")
    return found


def as_reference(data, where):
    """The student's schedule, from its data, rebuilt with the kit's ``Action`` and
    ``Schedule``."""
    if isinstance(data, str):
        pytest.fail(f"{where} did not return a Schedule whose actions are per-rank tuples of "
                    f"Action(kind, microbatch, stage) ({data}); keep the generator's "
                    f"`return Schedule(...)` and append one tuple of Actions per rank")
    actions = [[SimpleNamespace(kind=k, microbatch=mb, stage=st) for k, mb, st in ops]
               for ops in data["actions"]]
    return normalized(SimpleNamespace(**{**data, "actions": actions}))


def student_schedules(impl, run_alone, generator, sizes):
    return dict(zip(sizes, run_alone(schedules_as_data, impl, generator, list(sizes))))


def row(schedule, rank):
    return " ".join(f"{action.kind}{action.microbatch}" for action in schedule.actions[rank])


def checked(schedules, generator, p, m):
    """The student's schedule for (p, m), validated; a failure quotes the validator and hints."""
    where = f"{generator}(p={p}, m={m})"
    schedule = as_reference(schedules[p, m], where)
    try:
        validate(schedule, in_order=True)
    except ScheduleError as error:
        problem = str(error)
    else:
        return schedule
    listing = "\n".join(f"  rank {rank}: {row(schedule, rank)}"
                        for rank in range(len(schedule.actions)))
    pytest.fail(f"{where} is not a valid schedule: {problem}\nyour schedule:\n{listing}"
                f"{warm_up_note(schedule, generator, p, m)}\nhint: {HINTS[generator]}",
                pytrace=False)


def first_difference(expected, got):
    expected, got = expected.split(), got.split()
    for step, (want, have) in enumerate(zip(expected, got)):
        if want != have:
            return f"the first action out of order is step {step}, your {have}"
    if len(got) < len(expected):
        return f"it stops after {len(got)} actions, before the last of its passes"
    return f"it has {len(got) - len(expected)} extra action(s) from step {len(expected)} on: " \
           f"{' '.join(got[len(expected):])}"


@pytest.mark.parametrize("generator", ["gpipe", "one_f_one_b"])
def test_valid_for_every_size(impl, run_alone, generator):
    check_valid(impl, run_alone, generator, SIZES)


def check_valid(impl, run_alone, generator, sizes):
    schedules = student_schedules(impl, run_alone, generator, sizes)
    for p, m in sizes:
        schedule = checked(schedules, generator, p, m)
        assert (schedule.ranks, schedule.microbatches, schedule.chunks) == (p, m, 1), (
            f"{generator}(p={p}, m={m}) says it is for p={schedule.ranks}, "
            f"m={schedule.microbatches}, v={schedule.chunks}")


@pytest.mark.parametrize("generator, p, m", ORDERED)
def test_golden_order_on_every_rank(impl, run_alone, generator, p, m):
    check_golden(impl, run_alone, generator, p, m, snapshot("lab4", "orders")[f"{generator}/{p}/{m}"])


def check_golden(impl, run_alone, generator, p, m, rows):
    schedule = checked(student_schedules(impl, run_alone, generator, [(p, m)]), generator, p, m)
    for rank, expected in enumerate(rows):
        got = row(schedule, rank)
        assert got == expected, (
            f"{generator}(p={p}, m={m}) is valid, but rank {rank} runs its passes in another "
            f"order than {'GPipe' if generator == 'gpipe' else '1F1B'}:\n"
            f"  yours: {got}\n"
            f"{first_difference(expected, got)}{warm_up_note(schedule, generator, p, m)}\n"
            f"hint: {HINTS[generator]}")
        stages = {action.stage for action in schedule.actions[rank]}
        assert stages == {rank}, (f"{generator}(p={p}, m={m}): rank {rank}'s actions name "
                                  f"stage(s) {sorted(stages)}; with one chunk per rank they "
                                  f"all run at stage {rank}")


@pytest.mark.parametrize("generator", ["gpipe", "one_f_one_b"])
def test_simulated_bubble_is_the_least_the_pipeline_allows(impl, run_alone, generator):
    check_bubble(impl, run_alone, generator, [(1, 4), (2, 1), (2, 5), (3, 3), (4, 2), (4, 8),
                                              (5, 9)])


def check_bubble(impl, run_alone, generator, sizes):
    schedules = student_schedules(impl, run_alone, generator, sizes)
    for p, m in sizes:
        timeline = simulate(checked(schedules, generator, p, m), cost_f=1.0, cost_b=2.0)
        expected, makespan = snapshot("lab4", "bubbles")[f"{p}/{m}"]
        assert timeline.bubble_fraction == pytest.approx(expected, abs=1e-9), (
            f"{generator}(p={p}, m={m}), simulated with T_F = 1, T_B = 2: bubble "
            f"{timeline.bubble_fraction:.4f} and makespan {timeline.makespan:g}; expected "
            f"{expected:.4f} and {makespan:g}: some rank waits longer than it must. hint: "
            f"{HINTS[generator]}")


@pytest.mark.parametrize("generator", ["gpipe", "one_f_one_b"])
def test_peak_activations_in_flight(impl, run_alone, generator):
    check_peaks(impl, run_alone, generator, [(1, 3), (2, 5), (3, 2), (4, 4), (4, 8), (5, 9)])


def check_peaks(impl, run_alone, generator, sizes):
    schedules = student_schedules(impl, run_alone, generator, sizes)
    for p, m in sizes:
        schedule = checked(schedules, generator, p, m)
        peaks = simulate(schedule).peak_in_flight
        for rank, peak in enumerate(peaks):
            if generator == "gpipe":
                expected, why = m, "GPipe runs all m forwards before the first backward"
            else:
                expected = snapshot("lab4", "peaks")[f"{p}/{m}"][rank]
                why = (f"{'more' if peak > expected else 'fewer'} than 1F1B's, which starts each "
                       "backward as early as the pipeline allows")
            assert peak == expected, (
                f"{generator}(p={p}, m={m}): rank {rank} holds the activations of up to {peak} "
                f"microbatches at once (forwards whose backward has not run): "
                f"{why}.{warm_up_note(schedule, generator, p, m)}\n"
                f"hint: {HINTS[generator]}")
