"""Lab 4, hidden checks: the public checks' functions on other pipeline sizes, microbatch
counts, schedules and pipeline layouts, with the same messages."""
import pytest

from reference_impl.course.sweeps import group_layouts
from test_lab4_executor import check_pipelined_step
from test_lab4_schedules import check_bubble, check_golden, check_peaks, check_valid

pytestmark = pytest.mark.lab4

SEED = 101
OTHER_SIZES = [(p, m) for p in (6, 7) for m in range(1, 13)]
GOLDEN = {  # by hand from the rules: GPipe all F then all B; 1F1B min(p - r, m) warm-up forwards
    ("gpipe", 4, 2): ["F0 F1 B0 B1"] * 4,
    ("one_f_one_b", 3, 5): ["F0 F1 F2 B0 F3 B1 F4 B2 B3 B4", "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4",
                            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4"],
    ("one_f_one_b", 4, 3): ["F0 F1 F2 B0 B1 B2", "F0 F1 F2 B0 B1 B2", "F0 F1 B0 F2 B1 B2",
                            "F0 B0 F1 B1 F2 B2"],
}
ROWS = {
    ("gpipe", 2, 3): ["F0 F1 F2 B0 B1 B2"] * 2,
    ("1f1b", 2, 3): ["F0 F1 B0 F2 B1 B2", "F0 B0 F1 B1 F2 B2"],
    ("1f1b", 4, 3): GOLDEN["one_f_one_b", 4, 3],
}
STEPS = [  # (rows key, layout, one request per batch)
    (("gpipe", 2, 3), "strided", False),
    (("1f1b", 2, 3), "permuted", True),
    (("1f1b", 4, 3), "world", True),
]


@pytest.mark.parametrize("generator", ["gpipe", "one_f_one_b"])
def test_schedules_on_other_sizes(impl, run_alone, generator):
    check_valid(impl, run_alone, generator, OTHER_SIZES)
    check_bubble(impl, run_alone, generator, [(6, 3), (3, 7), (6, 11), (2, 12)])
    check_peaks(impl, run_alone, generator, [(6, 3), (3, 7), (6, 11), (7, 2)])


@pytest.mark.parametrize("generator, p, m", sorted(GOLDEN))
def test_schedules_golden_on_other_sizes(impl, run_alone, generator, p, m):
    check_golden(impl, run_alone, generator, p, m, GOLDEN[generator, p, m])


@pytest.mark.parametrize("step", range(len(STEPS)))
def test_pipelined_step_on_other_layouts_and_microbatches(impl, run_on_ranks, step):
    (name, p, m), layout, coalesced = STEPS[step]
    pipelines = group_layouts(4, p, SEED)[layout]
    check_pipelined_step(run_on_ranks, impl, f"{name}, p={p}, m={m}, pipelines {pipelines}",
                         name, ROWS[name, p, m], m, pipelines, coalesced)
