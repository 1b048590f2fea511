"""The pipeline executor trains the GPT exactly as one device does, for every schedule.

For every schedule of ``SCHEDULES`` (naive only with m = 1), p in {2, 4} and m in {1, p, 2p,
p + 1} where the schedule takes it (interleaved, v = 2, needs m % p == 0), the loss and every
parameter gradient match single-device training of the same GPT on the same batch: the mean
of the m microbatch losses (each scaled by 1/m) is the full batch's mean cross-entropy.

Tolerance (fp32): pipelining changes only how the batch's gradient is summed (m microbatch
gradients of 1/m-scaled losses instead of one), so loss and gradients agree to atol 1e-5,
rtol 1e-5 (observed: loss within 3e-7, gradients within 3e-8).

One launch per (schedule, p) runs all its m values inside the ranks, to keep the file fast.
"""
import copy

import pytest
import torch

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.comm.rank_failures import RankFailure
from reference_impl.model import GPT, ModelConfig
from reference_impl.pipeline.pipeline_executor import gpt_loss, pipeline_train_step, run_schedule, \
    split_batch
from reference_impl.pipeline.named_schedules import SCHEDULES, build_schedule
from reference_impl.pipeline.pipeline_schedules import schedule_from_strings
from reference_impl.pipeline.pipeline_simulator import simulate
from reference_impl.pipeline.pipeline_validator import ScheduleError

ATOL = RTOL = 1e-5
MICRO_BATCH = 2
# 6 blocks + embedding + head = 8 layers: enough for p*v = 4*2 stages.
CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=6)


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def batch(m: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    shape = (MICRO_BATCH * m, CONFIG.seq_len)
    return (torch.randint(0, CONFIG.vocab_size, shape, generator=generator),
            torch.randint(0, CONFIG.vocab_size, shape, generator=generator))


def microbatch_counts(name: str, p: int) -> list[int]:
    if name == "naive":
        return [1]
    counts = [1, p, 2 * p, p + 1]
    if name == "interleaved":
        counts = [m for m in counts if m % p == 0]
    return counts


def chunks_of(name: str) -> int:
    return 2 if name == "interleaved" else 1


def train_every_m(gpt, name, p):
    """On each rank: one pipelined step for every m; (m, loss, grads, peak saved) per m."""
    results = []
    for m in microbatch_counts(name, p):
        tokens, targets = batch(m, seed=m)
        step = pipeline_train_step(gpt, name, tokens, targets, microbatches=m,
                                   chunks=chunks_of(name))
        results.append((m, step.loss, step.grads, step.run.peak_saved))
    return results


def single_device(gpt, m):
    reference = copy.deepcopy(gpt)
    tokens, targets = batch(m, seed=m)
    loss = gpt_loss(reference(tokens), targets)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in reference.named_parameters()}


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_pipelined_step_matches_single_device(run_on_ranks, name, p):
    gpt = tiny_gpt()
    per_rank = run_on_ranks(train_every_m, p, gpt, name, p)
    for index, m in enumerate(microbatch_counts(name, p)):
        loss, grads = single_device(gpt, m)
        schedule = build_schedule(name, p, m, chunks_of(name))
        seen = set()
        for rank, results in enumerate(per_rank):
            got_m, got_loss, got_grads, peak_saved = results[index]
            assert got_m == m
            what = f"{name} p={p} m={m}"
            assert_close(got_loss, loss, f"{what}: loss", rank=rank, atol=ATOL, rtol=RTOL,
                         likely_cause="each microbatch's loss must be scaled by 1/m and "
                                      "summed over the microbatches")
            for parameter, grad in got_grads.items():
                assert_close(grad, grads[parameter], f"{what}: gradient of {parameter}",
                             rank=rank, atol=ATOL, rtol=RTOL,
                             likely_cause="a microbatch's backward ran with the wrong "
                                          "received gradient, twice, or not at all")
            assert not seen & set(got_grads), f"{what}: parameters on two ranks"
            seen |= set(got_grads)
            # held until their last use: B, or W when the backward is split (ZB-H1)
            assert peak_saved == simulate(schedule).peak_in_flight[rank], (
                f"{what}: rank {rank} held {peak_saved} (microbatch, stage) entries, the "
                f"simulator says {simulate(schedule).peak_in_flight[rank]}")
        assert seen == set(grads), f"{name} p={p} m={m}: missing gradients {set(grads) - seen}"


def test_split_batch_refuses_a_batch_not_divisible_by_m():
    with pytest.raises(ValueError, match="batch of 10 samples is not divisible into 4 "
                                         "microbatches"):
        split_batch(torch.zeros(10, 8), 4)
    assert [len(part) for part in split_batch(torch.zeros(12, 8), 4)] == [3, 3, 3, 3]


def step_with_indivisible_batch(gpt):
    tokens, targets = batch(5, seed=0)  # 10 samples
    pipeline_train_step(gpt, "1f1b", tokens, targets, microbatches=4)


def test_train_step_refuses_a_batch_not_divisible_by_m(run_on_ranks):
    with pytest.raises(RankFailure, match="batch of 10 samples is not divisible into 4 "
                                          "microbatches"):
        run_on_ranks(step_with_indivisible_batch, 2, tiny_gpt())


def interleaved_with_m_not_multiple_of_p(gpt):
    tokens, targets = batch(6, seed=0)
    pipeline_train_step(gpt, "interleaved", tokens, targets, microbatches=6, chunks=2)


def test_interleaved_refuses_m_not_a_multiple_of_p(run_on_ranks):
    with pytest.raises(ValueError, match=r"number of microbatches \(6\) to be a multiple of "
                                         r"the pipeline size \(4\)"):
        build_schedule("interleaved", 4, 6, 2)
    with pytest.raises(RankFailure, match=r"microbatches \(6\) to be a multiple of the "
                                          r"pipeline size \(4\)"):
        run_on_ranks(interleaved_with_m_not_multiple_of_p, 4, tiny_gpt())


# Rank 0 waits for microbatch 0's gradient before it sends microbatch 1's activation;
# rank 1 starts with microbatch 1: each waits for the other, forever.
CROSSING = ["F0 B0 F1 B1", "F1 B1 F0 B0"]


def test_deadlocking_schedule_is_refused_before_any_communication():
    schedule = schedule_from_strings(CROSSING, microbatches=2)
    # No process group at all here: the refusal cannot have come from a message.
    with pytest.raises(ScheduleError, match="deadlock: rank"):
        run_schedule(schedule, {0: torch.nn.Identity()}, torch.zeros(2, 1))


def run_crossing():
    device = current_device()
    schedule = schedule_from_strings(CROSSING, microbatches=2)
    stage = torch.nn.Linear(4, 4).to(device)
    rank = torch.distributed.get_rank()
    run_schedule(schedule, {rank: stage}, torch.zeros(2, 4, device=device),
                 torch.zeros(2, 4, device=device),
                 lambda y, t: y.sum(), boundary_shape=(1, 4))


def test_deadlocking_schedule_fails_fast_on_ranks(run_on_ranks):
    with pytest.raises(RankFailure, match="deadlock"):
        run_on_ranks(run_crossing, 2, timeout=30)
