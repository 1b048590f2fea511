"""Expert parallelism in the trainer (``--experts``, ``--top-k``, ``--ep``;
``hybrid/expert_parallel_blocks.py``): a model with MoE blocks trained under ep x dp, with pp,
against the same model on one device; what does not compose refused before any rank starts;
a checkpoint of an EP run resumed without EP.

Tolerances: with no capacity limit every token reaches its top-k experts whatever the
layout, so only the order of additions changes: losses to 1e-5 (``support/training.py``'s
ATOL; observed <= 2.4e-7). ``--clip-grad 0.05`` makes clipping act on every step, so a global
norm that misses or double-counts the experts shows in the losses.
"""
import pytest
import torch

from reference_impl import train
from reference_impl.checks import assert_close
from reference_impl.hybrid import checkpoint
from support.training import ATOL, assert_the_trainer_trains_as_one_device

TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "30",
        "--batch", "8", "--adam-eps", "1e-4", "--lr", "1e-2", "--clip-grad", "0.05"]


@pytest.mark.parametrize("flags", [
    "--experts 4 --ep 2 --dp 2",
    "--model llama --experts 4 --top-k 1 --ep 4 --dp 4",
    "--experts 4 --ep 2 --dp 2 --pp 2 --microbatches 2",
])
def test_expert_parallel_training_matches_one_device(flags):
    assert_the_trainer_trains_as_one_device([*TINY, *flags.split(), "--steps", "3"],
                                            f"experts: {flags}")


@pytest.mark.parametrize("flags, message", [
    ("--ep 2 --dp 2", "ep 2 needs a mixture-of-experts model; the model is dense"),
    ("--experts 4 --ep 2 --dp 3 --batch 6", "the data-parallel size dp = 3 is not divisible by ep = 2"),
    ("--experts 3 --ep 2 --dp 2", "3 experts are not divisible by ep = 2"),
    ("--experts 4 --tp 2", "experts with tp = 2"),
    ("--experts 4 --ep 2 --dp 2 --dp-kind zero1", "ep = 2 with dp_kind zero1"),
    ("--experts 4 --ep 2 --dp 2 --recompute full", "ep = 2 with recompute full"),
    ("--experts 2 --top-k 3", "top_k = 3 must be between 1 and the number of experts"),
])
def test_what_does_not_compose_with_experts_is_refused_before_any_rank_starts(flags, message):
    with pytest.raises(ValueError, match=message):
        train.main([*TINY, *flags.split(), "--steps", "1"])


def test_an_expert_parallel_checkpoint_resumes_without_expert_parallelism(tmp_path):
    argv = [*TINY, "--experts", "4", "--optimizer", "adamw", "--warmup-steps", "2",
            "--decay-steps", "6"]
    expected, _ = train.train_one_device(train.parse_args([*argv, "--steps", "6"]))
    directory = str(tmp_path / "ckpt")
    train.main([*argv, "--ep", "2", "--dp", "2", "--steps", "3", "--checkpoint-dir", directory])
    gpt = checkpoint.single_device_gpt(directory)  # every expert, gathered from the EP ranks
    assert sum(".moe.experts." in name for name, _ in gpt.named_parameters()) == 2 * 4 * 4
    resumed = train.main([*argv, "--dp", "2", "--dp-kind", "zero2", "--steps", "6",
                          "--checkpoint-dir", directory, "--resume"])
    assert_close(torch.tensor(resumed["losses"]), torch.tensor(expected[3:]),
                 "steps 4..6 resumed as dp 2, zero2 from an ep 2 x dp 2 checkpoint", atol=ATOL)


def test_a_checkpoint_records_the_experts_when_rank_0_holds_no_block(tmp_path):
    directory = str(tmp_path / "ckpt")  # pp 4 over 2 blocks + embedding + head: one layer each
    train.main([*TINY, "--experts", "2", "--pp", "4", "--microbatches", "4", "--steps", "1",
                "--checkpoint-dir", directory])
    assert checkpoint.read_run(directory)["experts"] == [2, 2]
    assert sum(".moe.experts." in name
               for name, _ in checkpoint.single_device_gpt(directory).named_parameters()) == 16
