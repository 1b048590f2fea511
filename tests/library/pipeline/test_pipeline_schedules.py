"""Pipeline schedule generators: every one is valid for many sizes, small cases match golden
per-rank orders derived by hand from the papers' rules, and bad input is refused by number."""
import pytest

from reference_impl.pipeline.interleaved import interleaved_one_f_one_b
from reference_impl.pipeline.named_schedules import SCHEDULES, build_schedule
from reference_impl.pipeline.pipeline_schedules import (
    Action, gpipe, naive, one_f_one_b, schedule_from_strings, zb_h1)
from reference_impl.pipeline.pipeline_validator import validate

SIZES = [(p, m) for p in range(1, 6) for m in range(1, 10)]


@pytest.mark.parametrize("generator", [gpipe, one_f_one_b, zb_h1])
def test_every_schedule_is_valid_and_keeps_every_link_in_order(generator):
    for p, m in SIZES:
        schedule = generator(p, m)
        assert (schedule.ranks, schedule.microbatches, schedule.chunks) == (p, m, 1)
        validate(schedule, in_order=True)


def test_every_interleaved_schedule_is_valid_and_keeps_every_link_in_order():
    for p in range(1, 6):
        for v in range(1, 4):
            for m in range(p, 10 * p, p):
                schedule = interleaved_one_f_one_b(p, m, v)
                assert (schedule.stages, schedule.chunks) == (p * v, v)
                validate(schedule, in_order=True)


def test_naive_is_one_microbatch_through_every_stage():
    for p in range(1, 6):
        schedule = naive(p)
        validate(schedule)
        assert [schedule.format(rank) for rank in range(p)] == ["F0 B0"] * p


@pytest.mark.parametrize("schedule, rows", [
    (gpipe(2, 3), ["F0 F1 F2 B0 B1 B2", "F0 F1 F2 B0 B1 B2"]),
    # rank r: min(p - r - 1, m) warm-up forwards, then F/B pairs, then the cool-down
    (one_f_one_b(2, 3), ["F0 F1 B0 F2 B1 B2", "F0 B0 F1 B1 F2 B2"]),
    (one_f_one_b(3, 4), ["F0 F1 F2 B0 F3 B1 B2 B3", "F0 F1 B0 F2 B1 F3 B2 B3",
                         "F0 B0 F1 B1 F2 B2 F3 B3"]),
    (one_f_one_b(4, 2), ["F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"]),
    # 1F1B's F/B order; rank r postpones its first r W passes to the end
    (zb_h1(3, 4), ["F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3",
                   "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3",
                   "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3"]),
    # k-th forward: chunk (k // p) % v, microbatch (k // (p*v))*p + k % p; backward: chunks
    # reversed. Warm-up (v-1)p + 2(p-r-1): 4 on rank 0, 2 on rank 1.
    (interleaved_one_f_one_b(2, 4, 2),
     ["F0s0 F1s0 F0s2 F1s2 F2s0 B0s2 F3s0 B1s2 F2s2 B0s0 F3s2 B1s0 B2s2 B3s2 B2s0 B3s0",
      "F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 F2s1 B0s1 F3s1 B1s1 F2s3 B2s3 F3s3 B3s3 B2s1 B3s1"]),
])
def test_golden_orders(schedule, rows):
    assert [schedule.format(rank) for rank in range(schedule.ranks)] == rows


def test_interleaved_with_one_chunk_is_1f1b():
    for p, m in [(1, 3), (2, 4), (4, 8)]:
        assert interleaved_one_f_one_b(p, m, 1).actions == one_f_one_b(p, m).actions


def test_megatron_placement_and_text_round_trip():
    schedule = interleaved_one_f_one_b(4, 8, 3)
    assert schedule.stages_of(1) == (1, 5, 9)
    assert [schedule.rank_of(stage) for stage in (0, 3, 4, 11)] == [0, 3, 0, 3]
    rows = [schedule.format(rank) for rank in range(4)]
    again = schedule_from_strings(rows, microbatches=8, chunks=3)
    assert again.actions == schedule.actions
    assert str(one_f_one_b(2, 3)).splitlines() == [
        "1f1b: p=2 ranks, m=3 microbatches",
        "rank 0: F0 F1 B0 F2 B1 B2",
        "rank 1: F0 B0 F1 B1 F2 B2"]


def test_registry_builds_every_schedule():
    assert set(SCHEDULES) == {"naive", "gpipe", "1f1b", "interleaved", "zb-h1"}
    assert build_schedule("naive", 3).actions == naive(3).actions
    assert build_schedule("zb-h1", 3, 5).split_backward
    assert build_schedule("interleaved", 2, 4, v=2).chunks == 2
    assert zb_h1(2, 2).actions[1][-1] == Action("W", 1, 1)


@pytest.mark.parametrize("call, message", [
    (lambda: naive(0), "the number of ranks p must be an integer >= 1, got 0"),
    (lambda: gpipe(2, 0), "the number of microbatches m must be an integer >= 1, got 0"),
    (lambda: one_f_one_b(-1, 4), "the number of ranks p must be an integer >= 1, got -1"),
    (lambda: one_f_one_b(2, 2.5), "microbatches m must be an integer >= 1, got 2.5"),
    (lambda: zb_h1(3, 0), "the number of microbatches m must be an integer >= 1, got 0"),
    (lambda: interleaved_one_f_one_b(4, 6, 2),
     r"interleaved 1F1B needs the number of microbatches \(6\) to be a multiple of the "
     r"pipeline size \(4\)"),
    (lambda: interleaved_one_f_one_b(2, 4, 0),
     "the number of chunks per rank v must be an integer >= 1, got 0"),
    (lambda: build_schedule("dualpipe", 2, 4), "unknown schedule 'dualpipe'"),
    (lambda: build_schedule("naive", 2, 3), "the naive schedule runs a single microbatch, got m=3"),
    (lambda: build_schedule("1f1b", 2, 4, v=2), "schedule '1f1b' has one chunk per rank, got v=2"),
    (lambda: one_f_one_b(2, 2).rank_of(2), r"stage 2 is out of range: this schedule has 2 stages"),
    (lambda: schedule_from_strings(["F0 X1"], 2), "rank 0: cannot read 'X1'"),
    (lambda: schedule_from_strings(["F0 B0", "F0 B0"], 1, chunks=2),
     "rank 0: 'F0' needs a stage"),
])
def test_bad_input_is_refused_naming_the_numbers(call, message):
    with pytest.raises(ValueError, match=message):
        call()
