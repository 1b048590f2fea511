"""Lab 4, hidden checks: the public checks' functions on other pipeline sizes, microbatch
counts, schedules, pipeline layouts and boundary dtypes (fp64, bf16), with the same messages."""
import pytest
import torch

from reference_impl.course.sweeps import group_layouts
from test_lab4_executor import FP32, FP64, check_pipelined_step
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
    # the kit's own generators (not exercises), as they print
    ("zb-h1", 4, 6): ["F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5",
                      "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5",
                      "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5",
                      "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5"],
    ("zb-h1", 2, 3): ["F0 F1 B0 W0 F2 B1 W1 B2 W2", "F0 B0 F1 B1 W0 F2 B2 W1 W2"],
    ("interleaved", 2, 2): ["F0s0 F1s0 F0s2 F1s2 B0s2 B1s2 B0s0 B1s0",
                            "F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 B0s1 B1s1"],
}
STEPS = [  # (rows key, layout, one request per batch, the GPT's and its boundary's dtype)
    (("gpipe", 2, 3), "strided", False, FP32),
    (("1f1b", 2, 3), "permuted", True, FP32),
    (("1f1b", 4, 3), "world", True, FP32),
    (("zb-h1", 4, 6), "world", True, FP32),
    (("zb-h1", 2, 3), "consecutive", False, FP64),
    (("interleaved", 2, 2), "strided", False, FP32),
    (("1f1b", 4, 3), "world", False, torch.bfloat16),
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
    (name, p, m), layout, coalesced, dtype = STEPS[step]
    pipelines = group_layouts(4, p, SEED)[layout]
    check_pipelined_step(run_on_ranks, impl, f"{name}, p={p}, m={m}, {dtype}, pipelines "
                         f"{pipelines} (seed {SEED})", name, ROWS[name, p, m], m, pipelines,
                         coalesced, dtype)
