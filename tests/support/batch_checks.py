"""Graded checks of lab 0 for the tests of the batch grader (``tests/course/test_grade_*.py``),
and the grader run on them: fixed checks, so that those tests do not change as lab 0's do."""
from pathlib import Path

# The grader, with its public and hidden test folders given first.
GRADE = """import sys
from pathlib import Path

from reference_impl.course.grade import cli, running

running.GRADED_TESTS, running.HIDDEN_TESTS = Path(sys.argv[1]), Path(sys.argv[2])
sys.exit(cli.main(sys.argv[3:]))
"""

# Two public checks of lab 0: the ring all-reduce on a subgroup of 4 ranks (rank 0 in it), under
# the grader's launch limit, its result sent back as the submission returns it; then the ring's
# alpha-beta time in a helper process.
PUBLIC_CHECKS = """import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close
from reference_impl.comm.alpha_beta import ring_all_reduce_seconds

pytestmark = pytest.mark.lab0
MEMBERS = [0, 2]


def ring_on_a_subgroup(impl):
    collectives = impl.module("collectives")
    group = dist.new_group(MEMBERS)  # collective: every rank makes it
    tensor = torch.arange(6, dtype=torch.float64) + 10 * dist.get_rank()
    return collectives.ring_all_reduce(tensor, group) if dist.get_rank() in MEMBERS else None


def test_ring_all_reduce_on_a_subgroup(impl, run_on_ranks):
    results = run_on_ranks(ring_on_a_subgroup, 4, impl)
    for rank in MEMBERS:
        assert_close(results[rank], 2 * torch.arange(6, dtype=torch.float64) + 20,
                     "ring_all_reduce over ranks [0, 2]", rank=rank,
                     likely_cause="each step must add the chunk received to the rank's own")


def ring_time(impl):
    return impl.module("alpha_beta").ring_all_reduce_seconds(1e6, 4, 2e-5, 1e9)


def test_ring_time_in_a_helper(impl, run_alone):
    assert run_alone(ring_time, impl) == pytest.approx(ring_all_reduce_seconds(1e6, 4, 2e-5, 1e9))
"""


def tiers(root: Path, public: str, hidden: str = "") -> tuple[Path, Path]:
    """Folders ``root/public`` and ``root/hidden`` (named as the kit's), each holding its lab 0
    checks (none where the text is empty)."""
    folders = root / "public", root / "hidden"
    for folder, text in zip(folders, (public, hidden)):
        folder.mkdir(parents=True)
        if text:
            (folder / f"test_lab0_{folder.name}.py").write_text(text)
    return folders
