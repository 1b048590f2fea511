"""Lab 5, hidden checks: the public checks' functions on other seeds, sizes and layouts (the
same messages).

* ZeRO's shards alone: other shapes and group sizes (one element over 3 ranks, 42 over 4, 9
  over 2);
* the gradient sync: another batch, and one more shape, tp = 2 x pp = 2 (rdp = 1: Megatron's
  data-parallel group is a single rank, SageMaker's DP_GROUP is the TP group);
* the hooks: other bucket sizes (100, 333 and 1000 bytes), every layout in both dtypes.
"""
import pytest

from test_lab5_ddp import check_sweep, sweep_cases
from test_lab5_hybrid import SHAPES, check_sync_sweep, sync_cases
from test_lab5_zero import check_shards

pytestmark = pytest.mark.lab5

OTHER = 7919  # added to the sweep's seed: other draws than the public checks'
SHARDS = [((1,), 3), ((6, 7), 4), ((3, 3), 2), ((11,), 4), ((2, 3, 5), 3)]
HIDDEN_SHAPES = SHAPES + ((2, 2),)
BUCKETS = (100, 333, 1000)


def test_hidden_zero_shards_of_other_shapes(impl, run_alone):
    check_shards(impl, run_alone, SHARDS)


@pytest.mark.parametrize("convention", ["sagemaker", "megatron"])
def test_hidden_sync_on_other_shapes(impl, run_on_ranks, sweep_seed, convention):
    check_sync_sweep(run_on_ranks, impl, sweep_seed + OTHER,
                     sync_cases(convention, HIDDEN_SHAPES))


def test_hidden_ddp_with_other_buckets(impl, run_on_ranks, sweep_seed):
    seed = sweep_seed + OTHER
    check_sweep(run_on_ranks, impl, seed, sweep_cases(seed, bucket_bytes=BUCKETS, extra=2))
