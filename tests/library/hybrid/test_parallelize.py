"""``hybrid/parallelize.py``: every technique of the kit composed on the course's GPT, against
single-device training of the same GPT on the same global batches.

A matrix of small combinations of dp x tp x pp, sequence parallelism (sp), recomputation and
the kind of data parallelism (sync, ddp_hooks, zero1-3), fp32 and bf16, run in two launches
(4 CPU ranks, then 8), several combinations per launch; for each, the loss of every step and
every weight after the steps (gathered to the single-device names) on every rank.

Tolerances (``support/training.py`` holds them, with the helpers). fp32: TP, SP, PP, DP, ZeRO
and recomputation change only the order of additions (recomputation: none at all), so losses
and weights agree to atol 1e-5 (``test_hybrid.py``'s; Adam's eps is 1e-4 for the reason given
there). bf16: the kit's (``test_bf16.py``): losses to 2e-2 of their scale, weights to 3e-2 of
the largest change the steps made; Adam's eps is 1e-2 there, since a gradient made of bf16
rounding noise would otherwise move a weight by lr with either sign. Observed on CPU (torch
2.13), largest over ranks and combinations: fp32 losses 4.8e-7, weights 2.7e-7; bf16 losses
1.3e-4 and weights 9.8e-3 of their scales (each combination's own figures are printed with
``-s``). Then the refused combinations, each with the rule and the numbers in its message, and
the trainer's flags end to end.
"""
import pytest
import torch

from reference_impl import train
from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.model import GPT, ModelConfig
from support.training import (assert_the_trainer_trains_as_one_device, check,
                              single_device_oracles, train_combinations)

STEPS, BATCH = 3, 8
CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=2)
TIMEOUT = 120  # one launch of 8 ranks on 2 cores takes seconds, far from this

# (name, TrainingPlan fields, optimizer); the world is dp * tp * pp
MATRIX = {
    4: [
        ("tp2-sp-zero1-selective", dict(dp=2, tp=2, sp=True, dp_kind="zero1",
                                        recompute="selective"), "adam"),
        ("dp2-tp2-full-sync", dict(dp=2, tp=2, recompute="full"), "sgd"),
        ("dp2-tp2-sp-zero2", dict(dp=2, tp=2, sp=True, dp_kind="zero2"), "adam"),
        ("dp2-pp2-zero3-selective", dict(dp=2, pp=2, dp_kind="zero3", recompute="selective",
                                         microbatches=2), "adam"),
        ("dp4-zero3", dict(dp=4, dp_kind="zero3", microbatches=2), "adam"),
        ("dp2-tp2-sp-zero3-full", dict(dp=2, tp=2, sp=True, dp_kind="zero3",
                                       recompute="full"), "adam"),
        ("dp2-pp2-ddp_hooks-full-gpipe", dict(dp=2, pp=2, dp_kind="ddp_hooks",
                                              recompute="full", schedule="gpipe"), "sgd"),
        ("bf16-tp2-sp-zero1-selective", dict(dp=2, tp=2, sp=True, dp_kind="zero1",
                                             recompute="selective", precision="bf16"), "adam"),
        ("bf16-dp2-pp2-zero3", dict(dp=2, pp=2, dp_kind="zero3", precision="bf16"), "adam"),
    ],
    8: [
        ("dp2-pp2-tp2-sp-ddp_hooks-full", dict(dp=2, tp=2, pp=2, sp=True, dp_kind="ddp_hooks",
                                               recompute="full", microbatches=2), "adam"),
        ("dp2-pp2-tp2-sync-interleaved-selective", dict(
            dp=2, tp=2, pp=2, sp=True, recompute="selective", schedule="interleaved",
            chunks=2, microbatches=2, vocab_parallel=False), "sgd"),
        ("dp2-pp2-tp2-zero1-zb", dict(dp=2, tp=2, pp=2, dp_kind="zero1", schedule="zb-h1",
                                      microbatches=2), "adam"),
        ("bf16-dp2-pp2-tp2-sp-zero2-full", dict(dp=2, tp=2, pp=2, sp=True, dp_kind="zero2",
                                                recompute="full", precision="bf16"), "adam"),
    ],
}
OBSERVED = {}  # filled by the tests: name -> (loss difference, weight difference)


@pytest.fixture(scope="module")
def reference():
    """The GPT, the batches and single-device training per (precision, optimizer)."""
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    dataset = hybrid.make_dataset(0, STEPS, BATCH, CONFIG.seq_len, CONFIG.vocab_size)
    return gpt, dataset, single_device_oracles(gpt, dataset)


@pytest.mark.parametrize("world", [pytest.param(world, marks=[pytest.mark.slow] if world > 4 else [])
                                   for world in sorted(MATRIX)])  # 8 ranks on 2 cores: slow
def test_compositions_match_single_device_training(run_on_ranks, reference, world):
    gpt, dataset, oracles = reference
    combinations = MATRIX[world]
    results = run_on_ranks(train_combinations, world, gpt, dataset, combinations,
                           timeout=TIMEOUT)
    for rank, by_name in enumerate(results):
        for name, fields, optimizer in combinations:
            check(name, fields, optimizer, rank, by_name[name], gpt, oracles, OBSERVED)
    print("\nlargest difference (loss, weights):",
          {name: f"{a:.1e}, {b:.1e}" for name, (a, b) in OBSERVED.items()})


REFUSED = [
    (dict(tp=1, sp=True), "sequence parallelism needs tp > 1 (got tp = 1)"),
    (dict(dp=2, dp_kind="ddp_hooks", pp=2, schedule="zb-h1"),
     "dp_kind ddp_hooks with the zb-h1 schedule"),
    (dict(dp=2, dp_kind="zero2", pp=2, schedule="zb-h1"), "dp_kind zero2 with the zb-h1"),
    (dict(dp_kind="zero4"), "dp_kind must be one of sync, ddp_hooks, zero1, zero2, zero3"),
    (dict(recompute="some"), "recompute must be one of none, selective, full"),
    (dict(tp=0), "tp must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("fields, message", REFUSED, ids=[m[:30] for _, m in REFUSED])
def test_combinations_that_cannot_work_are_refused(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainingPlan(**fields)


@pytest.mark.parametrize("fields, config, batch, message", [
    (dict(tp=4, sp=True), ModelConfig(seq_len=10, heads=4, hidden=32), None,
     "seq_len 10 is not divisible by tp = 4"),
    (dict(tp=4), ModelConfig(heads=2, hidden=32), None,
     "heads 2 is not divisible by the tensor-parallel size tp = 4"),
    (dict(dp=2, microbatches=3), ModelConfig(), 8,
     "the global batch of 8 samples is not divisible by dp x microbatches = 2 x 3"),
    (dict(pp=4, chunks=2, schedule="interleaved"), ModelConfig(layers=2), None,
     "4 layers cannot fill pp x chunks = 4 x 2 = 8 pipeline stages"),
])
def test_model_shapes_the_dimensions_cannot_split_are_refused(fields, config, batch, message):
    with pytest.raises(ValueError, match=message):
        TrainingPlan(**fields).check(config, batch)


@pytest.mark.parametrize("argv, message", [
    (["--dp", "2", "--dp-kind", "zero1", "--optimizer", "sgd"],
     "dp_kind zero1 shards Adam's state"),
    (["--dp", "2", "--pp", "2", "--dp-kind", "fsdp2", "--schedule", "zb-h1"],
     "dp_kind fsdp2 with the zb-h1 schedule"),
    (["--sp"], "sequence parallelism needs tp > 1"),
    (["--tp", "2", "--sp", "--seq", "9"], "seq_len 9 is not divisible by tp = 2"),
])
def test_the_trainer_refuses_before_starting_ranks(argv, message):
    with pytest.raises(ValueError, match=message):
        train.main([*argv, "--steps", "1"])


def test_the_trainer_composes_its_flags_as_single_device_training():
    argv = ["--dp", "2", "--tp", "2", "--sp", "--dp-kind", "zero1", "--recompute", "selective",
            "--steps", "3", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8",
            "--vocab", "32", "--batch", "8", "--adam-eps", "1e-4"]
    assert_the_trainer_trains_as_one_device(argv, "dp 2 x tp 2, sp, zero1, selective")
