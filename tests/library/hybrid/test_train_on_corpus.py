"""The trainer on a corpus on disk (``--data``): each rank reads its share of every global batch
(``data/sharded_batches.py``), and the losses are one device's on the same batches under every
layout the trainer composes (dp, tp, pp, cp, ZeRO, FSDP2); the validation loss is one
device's too, a run resumed mid-epoch under another layout continues the same batches, and
``--out`` and ``--sample`` show the run. Tolerance: fp32, ATOL = 1e-5 on the losses (the
layouts change only the order of additions)."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from reference_impl import train
from reference_impl.checks import assert_close
from reference_impl.pipeline.gpt_stages import gpt_loss
from support import REPO

pytestmark = pytest.mark.slow  # about 90 s of launches

ATOL = 1e-5
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--batch", "8",
        "--optimizer", "adamw", "--adam-eps", "1e-4", "--lr", "1e-2", "--warmup-steps", "1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A text of 700 bytes: 78 windows of seq 8 for training, so an epoch is under 10 steps of
    batch 8 and a 12-step run crosses it."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    rng = np.random.default_rng(0)
    path.write_bytes(bytes(rng.choice(list(b"abcdefgh \n"), 700).tolist()))
    return str(path)


def one_device(argv):
    return train.train_one_device(train.parse_args(argv))


LAYOUTS = {
    "dp 2": ["--dp", "2"],
    "tp 2, vocabulary split": ["--tp", "2"],
    "pp 2, 1f1b": ["--pp", "2"],
    "cp 2 (llama)": ["--cp", "2", "--model", "llama", "--kv-heads", "2"],
    "dp 2 x cp 2 x tp 2, sp (llama)": ["--dp", "2", "--cp", "2", "--tp", "2", "--sp", "--model",
                                       "llama", "--kv-heads", "2"],
    "zero1, dp 2 x pp 2": ["--dp", "2", "--pp", "2", "--dp-kind", "zero1"],
    "zero2, dp 4": ["--dp", "4", "--dp-kind", "zero2"],
    "zero3, dp 2 x tp 2": ["--dp", "2", "--tp", "2", "--dp-kind", "zero3"],
    "fsdp2, dp 2": ["--dp", "2", "--dp-kind", "fsdp2"],
    "pp 2, interleaved, ddp_hooks dp 2": ["--pp", "2", "--schedule", "interleaved", "--chunks",
                                          "2", "--dp", "2", "--dp-kind", "ddp_hooks"],
    "ep 2 x dp 2, 4 experts (llama)": ["--dp", "2", "--ep", "2", "--experts", "4", "--model",
                                       "llama"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_losses_on_the_corpus_are_one_devices(corpus, layout):
    argv = ["--data", corpus, "--steps", "12", *TINY, *LAYOUTS[layout]]
    if "llama" not in layout:
        argv += ["--model", "gpt"]
    result = train.main(argv)
    expected, _ = one_device(argv)
    assert_close(torch.tensor(result["losses"]), torch.tensor(expected),
                 f"the losses of 12 steps on the corpus ({layout}) vs one device", atol=ATOL,
                 likely_cause="a rank read another share of the global batch than "
                              "replica_slice gives it")


def single_device_validation(argv, state) -> float:
    """The validation loss of the single-device GPT with ``state``, on the trainer's batches."""
    args = train.parse_args(argv)
    torch.manual_seed(args.seed)
    gpt = train.build_gpt(args)
    gpt.load_state_dict(state)
    batches = train.validation_data(args)
    with torch.no_grad():
        losses = [gpt_loss(gpt(tokens), targets).item() for tokens, targets in
                  (batches.global_batch(i) for i in range(train.evaluation_batches(args, batches)))]
    return sum(losses) / len(losses)


EVALUATED = {"pp 2 x tp 2, interleaved": ["--pp", "2", "--tp", "2", "--schedule", "interleaved",
                                          "--chunks", "2", "--layers", "4"],
             "dp 2 x cp 2 (llama)": ["--dp", "2", "--cp", "2", "--model", "llama"],
             "zero3": ["--dp", "2", "--dp-kind", "zero3"],
             "fsdp2, dp 2 x pp 2": ["--dp", "2", "--pp", "2", "--dp-kind", "fsdp2"]}


@pytest.mark.parametrize("layout", EVALUATED)
def test_the_validation_loss_is_one_devices(corpus, layout):
    """An evaluation mid-run and at the end: the single-device model's loss on the validation
    batches, the training around it unchanged (the losses still one device's), and the weights
    still gathered whole after it (the sample reads them)."""
    argv = ["--data", corpus, "--steps", "4", "--eval-every", "2", "--eval-batches", "2",
            "--sample", "2", *TINY, *EVALUATED[layout]]
    result = train.main(argv)
    assert [step for step, _ in result["val_losses"]] == [2, 4]
    losses, state = one_device(argv)
    assert_close(torch.tensor(result["losses"]), torch.tensor(losses),
                 f"the losses around the evaluations ({layout}) vs one device", atol=ATOL)
    expected = single_device_validation(argv, state)
    assert_close(torch.tensor(result["val_losses"][-1][1]), torch.tensor(expected),
                 f"the validation loss after 4 steps ({layout}) vs one device", atol=ATOL)
    assert result["val_losses"][0][1] != result["val_losses"][1][1]


def test_a_run_resumed_mid_epoch_in_another_layout_reads_the_same_batches(corpus, tmp_path):
    common = ["--data", corpus, "--steps", "12", "--decay-steps", "12", *TINY]
    straight = train.main(["--dp", "2", "--tp", "2", *common])
    directory = str(tmp_path / "ckpt")
    first = train.main(["--dp", "2", "--tp", "2", *common[:2], "--steps", "5", *common[4:],
                        "--checkpoint-dir", directory])
    assert first["losses"] == straight["losses"][:5]
    saved = torch.load(f"{directory}/checkpoint/run.pt", weights_only=False)
    assert saved["data"]["position"]["samples"] == 5 * 8
    assert 0 < saved["data"]["position"]["epochs"] % 1, "stopped mid-epoch"
    resumed = train.main(["--dp", "1", "--tp", "2", "--pp", "2", *common,
                          "--checkpoint-dir", directory, "--resume"])
    assert resumed["start_step"] == 5
    assert_close(torch.tensor(resumed["losses"]), torch.tensor(straight["losses"][5:]),
                 "steps 6..12 (across the epoch's end) resumed as tp 2 x pp 2 from dp 2 x tp 2",
                 atol=ATOL, likely_cause="the data stream did not continue where it stopped")


def test_a_resume_refuses_another_corpus(corpus, tmp_path):
    directory = str(tmp_path / "ckpt")
    train.main(["--data", corpus, "--steps", "2", *TINY, "--checkpoint-dir", directory])
    other = tmp_path / "other.txt"
    other.write_bytes(b"another text entirely, " * 40)
    with pytest.raises(ValueError, match="cannot resume: the checkpoint's data is"):
        train.main(["--data", str(other), "--steps", "4", *TINY, "--checkpoint-dir", directory,
                    "--resume"])


def test_bad_data_flags_are_refused_with_their_numbers(corpus, capsys):
    for argv, message in [
            (["--data", corpus, "--vocab", "100"], "--vocab 100 is smaller than the corpus's "
                                                   "vocabulary \\(256\\)"),
            (["--data", "/no/such/corpus"], "--data /no/such/corpus: no such file or folder"),
            (["--eval-every", "-1"], "--eval-every must be at least 0")]:
        with pytest.raises(SystemExit):
            train.parse_args(argv)
        assert re.search(message, capsys.readouterr().err), message
    with pytest.raises(ValueError, match="the validation split has 70 tokens: 8 windows of "
                                         "--seq 8 \\+ 1, fewer than the 64 one batch needs"):
        train.main(["--data", corpus, "--steps", "1", *TINY, "--batch", "64"])


def test_the_command_line_shows_logs_plots_and_samples(corpus, tmp_path):
    """The documented command, small: a progress bar, the log and the plot written, the
    validation loss beside the unigram entropy, and text sampled from the trained model."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "reference_impl.train", "--data", corpus, "--steps", "6",
               "--eval-every", "3", "--out", str(out), "--sample", "20", "--progress",
               "--log-every", "4",
               "--pp", "2", *TINY]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "6/6 [" in done.stderr and "loss=" in done.stderr, "a tqdm bar with the loss"
    assert "validation loss" in done.stdout and "unigram entropy of the corpus" in done.stdout
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6], "every step's"
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    sample = done.stdout.split("the prompt ends at \u2502):\n", 1)[1]
    prompt, continuation = sample.split("\u2502", 1)
    assert len(prompt) == 4, f"the prompt is seq / 2 tokens of the validation split: {sample!r}"
    assert continuation.strip(), f"no text sampled: {sample!r}"


def test_samples_are_the_same_under_any_layout(corpus):
    """Greedy sampling from the gathered weights: the same text from one rank and from a
    pp 2 x tp 2 layout (their weights differ by rounding only)."""
    argv = ["--data", corpus, "--steps", "3", "--sample", "12", "--temperature", "0",
            "--prompt", "abc", *TINY]
    alone = train.main(argv)["sample"]
    assert alone.startswith("abc\u2502") and len(alone) == 3 + 1 + 12
    assert train.main([*argv, "--pp", "2", "--tp", "2"])["sample"] == alone
