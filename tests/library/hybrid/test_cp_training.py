"""Context parallelism in ``parallelize.py`` and the trainer: a Llama-style GPT trained 2 steps
with cp composed with tp (with and without sp), dp (sync, ZeRO-1), pp and in bf16, against
single-device training of the same GPT on the same global batches (every step's loss, every
weight after the steps, on every rank); the CP layers and the sequence shard in place; then
``python -m reference_impl.train --model llama --cp 2 --tp 2`` end to end, and the refusals.

Tolerances: ``support/training.py``'s (fp32: atol 1e-5 on losses and weights; bf16: losses to
2e-2 of their scale, weights to 3e-2 of the largest change the steps made). Observed on CPU
(torch 2.13), largest over ranks and combinations (printed with ``-s``): fp32 losses 2.4e-7,
weights 1.5e-7; bf16 losses 8.1e-6 and weights 1.2e-2 of their scales.
"""
import pytest
import torch

from reference_impl import train
from reference_impl.cp.cp_attention import ContextParallelAttention
from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.hybrid.parallelize import parallelize_gpt
from reference_impl.model import ModelConfig, llama_config
from support.training import (assert_the_trainer_trains_as_one_device, check,
                              gpt_with_uneven_norms, single_device_oracles, train_combinations)

STEPS, BATCH = 2, 8
CONFIG = llama_config(vocab_size=32, seq_len=16, hidden=16, heads=4, kv_heads=2, layers=2)
# world size -> [(name, TrainingPlan fields, optimizer)]
MATRIX = {
    2: [("cp2", dict(cp=2), "adam")],
    4: [
        ("cp4", dict(cp=4), "sgd"),
        ("cp2-tp2", dict(cp=2, tp=2), "sgd"),
        ("cp2-tp2-sp", dict(cp=2, tp=2, sp=True), "adam"),
        ("cp2-dp2", dict(cp=2, dp=2), "sgd"),
        ("cp2-dp2-zero1", dict(cp=2, dp=2, dp_kind="zero1"), "adam"),
        ("cp2-pp2", dict(cp=2, pp=2, microbatches=2), "sgd"),
        ("bf16-cp2-tp2", dict(cp=2, tp=2, precision="bf16"), "adam"),
    ],
}
OBSERVED = {}


@pytest.mark.parametrize("world", MATRIX)
def test_cp_compositions_match_single_device_training(run_on_ranks, world):
    gpt = gpt_with_uneven_norms(CONFIG)
    dataset = hybrid.make_dataset(0, STEPS, BATCH, CONFIG.seq_len, CONFIG.vocab_size)
    oracles = single_device_oracles(gpt, dataset)
    results = run_on_ranks(train_combinations, world, gpt, dataset, MATRIX[world], timeout=240)
    for rank, by_name in enumerate(results):
        for name, fields, optimizer in MATRIX[world]:
            check(name, fields, optimizer, rank, by_name[name], gpt, oracles, OBSERVED)
    print("\nlargest difference (loss, weights):",
          {name: f"{a:.1e}, {b:.1e}" for name, (a, b) in OBSERVED.items()})


def cp_layers_and_shard(gpt, tokens):
    dims = TrainingPlan(cp=2, tp=2)
    context = hybrid.initialize_parallelism(1, 2, 1, cp=2)
    model = parallelize_gpt(gpt, dims, context)
    layers = sum(isinstance(module, ContextParallelAttention) for module in model.modules())
    return layers, hybrid.replica_slice(tokens, context).tolist(), context.coordinates.cp_rank


def test_every_attention_is_context_parallel_and_each_rank_holds_its_chunks(run_on_ranks):
    tokens = torch.arange(16).view(1, 16)  # chunks of 4: cp rank 0 holds 0 and 3, rank 1 1 and 2
    expected = {0: [0, 1, 2, 3, 12, 13, 14, 15], 1: [4, 5, 6, 7, 8, 9, 10, 11]}
    for layers, shard, cp_rank in run_on_ranks(cp_layers_and_shard, 4, gpt_with_uneven_norms(CONFIG), tokens):
        assert layers == CONFIG.layers
        assert shard == [expected[cp_rank]]


def test_the_trainer_trains_with_cp_as_one_device():
    argv = ["--model", "llama", "--cp", "2", "--tp", "2", "--steps", "3", "--layers", "2",
            "--hidden", "16", "--heads", "4", "--seq", "16", "--vocab", "32", "--batch", "4",
            "--adam-eps", "1e-4"]
    assert_the_trainer_trains_as_one_device(argv, "llama, tp 2 x cp 2")


@pytest.mark.parametrize("argv, message", [
    (["--cp", "2"], "context parallelism \\(cp = 2\\) needs rotary positions"),
    (["--model", "llama", "--cp", "2", "--seq", "18"],
     "2\\*cp = 4 chunks: seq 18 is not divisible by 4"),
    (["--model", "llama", "--cp", "2", "--tp", "4", "--sp", "--seq", "12"],
     "seq_len 12 / cp 2 = 6 tokens per CP rank are not divisible by tp = 4"),
])
def test_the_trainer_refuses_what_cp_cannot_split(argv, message):
    with pytest.raises(ValueError, match=message):
        train.main([*argv, "--steps", "1"])


def test_dims_refuse_a_context_of_another_cp():
    with pytest.raises(ValueError, match="cp must be an integer >= 1, got 0"):
        TrainingPlan(cp=0)
    assert TrainingPlan(dp=2, tp=2, cp=2, pp=2).world_size == 16
    with pytest.raises(ValueError, match="needs rotary positions"):
        TrainingPlan(cp=2).check(ModelConfig(seq_len=16))
