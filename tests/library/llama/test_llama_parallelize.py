"""``hybrid/parallelize.py`` and the trainer on a Llama-style GPT (``model.llama_config``): a few
compositions trained 2 steps on 4 CPU ranks against single-device training of the same GPT on
the same global batches (every step's loss, every weight after the steps, on every rank), with
the KV heads split (kv_heads 2 over tp 2) and replicated (kv_heads 1 over tp 2); then
``python -m reference_impl.train --model llama`` end to end, and its refusals.

Tolerances: ``support/training.py``'s (fp32: atol 1e-5 on losses and weights; bf16: losses to
2e-2 of their scale, weights to 3e-2 of the largest change the steps made). Observed on CPU
(torch 2.13), largest over ranks and combinations: fp32 losses 2.4e-7, weights 3.6e-7; bf16
losses 8.2e-5 and weights 1.4e-2 of their scales (printed with ``-s``).
"""
import pytest

from reference_impl import train
from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.model import llama_config
from support.training import (assert_the_trainer_trains_as_one_device, check,
                              gpt_with_uneven_norms, single_device_oracles, train_combinations)

STEPS, BATCH = 2, 8
SPLIT = llama_config(vocab_size=32, seq_len=8, hidden=16, heads=4, kv_heads=2, layers=2)
REPLICATED = llama_config(vocab_size=32, seq_len=8, hidden=16, heads=4, kv_heads=1, layers=2)
# config -> [(name, TrainingPlan fields, optimizer)], on 4 ranks
MATRIX = {
    "kv split": (SPLIT, [
        ("tp2-sp-zero1", dict(dp=2, tp=2, sp=True, dp_kind="zero1"), "adam"),
        ("pp2-tp2", dict(tp=2, pp=2, microbatches=2), "sgd"),
    ]),
    "kv replicated": (REPLICATED, [
        ("dp2-tp2-ddp_hooks-full", dict(dp=2, tp=2, dp_kind="ddp_hooks", recompute="full"),
         "sgd"),
        ("bf16-dp2-tp2-sp-zero3", dict(dp=2, tp=2, sp=True, dp_kind="zero3",
                                       precision="bf16"), "adam"),
    ]),
}
OBSERVED = {}


def train_every_model(models):
    return {label: train_combinations(gpt, dataset, combinations)
            for label, (gpt, dataset, combinations) in models.items()}


def test_llama_compositions_match_single_device_training(run_on_ranks):
    models, oracles = {}, {}
    for label, (config, combinations) in MATRIX.items():
        gpt = gpt_with_uneven_norms(config)
        dataset = hybrid.make_dataset(0, STEPS, BATCH, config.seq_len, config.vocab_size)
        models[label] = (gpt, dataset, combinations)
        oracles[label] = single_device_oracles(gpt, dataset)
    results = run_on_ranks(train_every_model, 4, models, timeout=180)
    for label, (gpt, _, combinations) in models.items():
        for rank, by_label in enumerate(results):
            for name, fields, optimizer in combinations:
                check(name, fields, optimizer, rank, by_label[label][name], gpt,
                      oracles[label], OBSERVED)
    print("\nlargest difference (loss, weights):",
          {name: f"{a:.1e}, {b:.1e}" for name, (a, b) in OBSERVED.items()})


def test_the_trainer_trains_a_llama_as_one_device():
    argv = ["--model", "llama", "--kv-heads", "1", "--dp", "2", "--tp", "2", "--sp",
            "--steps", "2", "--layers", "2", "--hidden", "16", "--heads", "4", "--seq", "8",
            "--vocab", "32", "--batch", "8", "--adam-eps", "1e-4"]
    args = assert_the_trainer_trains_as_one_device(argv, "llama, dp 2 x tp 2, sp")
    config = train.model_config(args)
    assert (config.kv_heads, config.positions, config.mlp) == (1, "rotary", "swiglu")


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama", "--heads", "4", "--kv-heads", "3"], "kv_heads 3 does not divide heads 4"),
    (["--model", "llama", "--heads", "6", "--hidden", "24", "--kv-heads", "3", "--tp", "2"],
     "kv_heads 3 and tp = 2"),
    (["--model", "llama", "--tp", "2", "--recompute", "selective"],
     "recompute selective re-implements"),
])
def test_the_trainer_refuses_llama_shapes_before_starting_ranks(argv, message):
    with pytest.raises(ValueError, match=message):
        train.main([*argv, "--steps", "1"])
