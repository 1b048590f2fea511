"""The MFU benchmark (``python -m reference_impl.benchmarks.mfu``): its FLOP count against a count
by hand and against Narayanan et al. 2021's closed form, its peak table, and a run end to end
on the CPU with tiny shapes (a subprocess, as a user runs it). Times are never asserted, only
that every number is printed and positive."""
import os
import re
import subprocess
import sys

import pytest

from reference_impl.benchmarks import mfu
from reference_impl.model import GPT, ModelConfig

from support import REPO
TINY = ModelConfig(vocab_size=8, seq_len=4, hidden=4, heads=2, layers=1)


def test_flops_per_token_by_hand():
    # One block of hidden h = 4 (f = 16): ln1 2h = 8; qkv 3h^2 + 3h = 60; proj h^2 + h = 20;
    # ln2 8; fc1 f h + f = 80; fc2 f h + h = 68: 244. Final layernorm 8, LM head V h = 32.
    n = 244 + 8 + 32
    assert mfu.flop_parameters(TINY) == n
    # 6 N (2 forward + 4 backward per parameter) + 12 L h s (scores and scores @ v, x 3)
    assert mfu.flops_per_token(TINY) == 6 * n + 12 * 1 * 4 * 4 == 1896


@pytest.mark.parametrize("config", [TINY, ModelConfig(), ModelConfig(
    vocab_size=100, seq_len=12, hidden=24, heads=3, layers=3, ffn_multiple=2)],
    ids=["tiny", "default", "ffn2"])
def test_n_is_every_parameter_but_the_embedding_tables(config):
    gpt = GPT(config)
    tables = gpt.token_embedding.weight.numel() + gpt.position_embedding.weight.numel()
    assert mfu.flop_parameters(config) == sum(p.numel() for p in gpt.parameters()) - tables


@pytest.mark.parametrize("config", [TINY, ModelConfig(vocab_size=50304, seq_len=2048,
                                                      hidden=2048, heads=16, layers=24)],
                         ids=["tiny", "1.5B"])
def test_count_is_narayanan_plus_biases_and_layernorms(config):
    """6 N + 12 L h s per token = the paper's 72 B s L h^2 (1 + s/6h + V/12Lh) per iteration
    (matmuls only) + 6 (13 h L + 2 h) per token for the biases and layernorms."""
    batch, h, L, s = 3, config.hidden, config.layers, config.seq_len
    ours = mfu.flops_per_token(config) * batch * s
    small_terms = 6 * (13 * h * L + 2 * h) * batch * s
    assert ours == pytest.approx(mfu.narayanan_flops_per_iteration(batch, config) + small_terms,
                                 rel=1e-12)
    # full recomputation adds one forward of the layers (not of the logit layer):
    # 24 B s L h^2 + 4 B s^2 L h
    extra = 24 * batch * s * L * h * h + 4 * batch * s * s * L * h
    assert mfu.narayanan_flops_per_iteration(batch, config, recompute=True) == pytest.approx(
        mfu.narayanan_flops_per_iteration(batch, config) + extra, rel=1e-12)


def test_the_1_5b_default_is_about_1_5b_parameters():
    d = mfu.GPU_DEFAULTS
    config = ModelConfig(vocab_size=d["vocab"], seq_len=d["seq"], hidden=d["hidden"],
                         heads=d["heads"], layers=d["layers"])
    total = mfu.flop_parameters(config) + config.vocab_size * config.hidden + \
        config.seq_len * config.hidden
    assert 1.3e9 < total < 1.6e9


def test_peak_table():
    assert mfu.peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312
    assert mfu.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989
    assert mfu.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756
    assert mfu.peak_tflops("NVIDIA H200", "bf16") == 989
    assert mfu.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 67
    assert mfu.peak_tflops("NVIDIA GeForce RTX 4090", "bf16") is None  # needs --peak


LINES = {
    "tokens/s": re.compile(r"^tokens/s: (\S+)$", re.M),
    "model TFLOP/s": re.compile(r"^model TFLOP/s: (\S+)$", re.M),
    "MFU": re.compile(r"^MFU: (\S+)% of (\S+) TFLOP/s \((.*)\)$", re.M),
}


def run_benchmark(*options):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "reference_impl.benchmarks.mfu",
                             "--device", "cpu", *options], cwd=REPO, env=env, text=True,
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("options", [[], ["--dtype", "bf16", "--attention", "explicit"]],
                         ids=["fp32-sdpa", "bf16-explicit"])
@pytest.mark.slow  # the benchmark's command line, end to end
def test_benchmark_runs_on_the_cpu_and_prints_positive_numbers(options):
    out = run_benchmark("--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "16",
                        "--batch", "2", "--vocab", "64", "--steps", "2", "--warmup", "1",
                        *options)
    for what, pattern in LINES.items():
        match = pattern.search(out)
        assert match, f"no {what} line in:\n{out}"
        assert float(match.group(1)) > 0, f"{what} is not positive:\n{out}"
    mfu_line = LINES["MFU"].search(out)
    assert float(mfu_line.group(2)) == mfu.NOMINAL_CPU_PEAK and "nominal" in mfu_line.group(3)
    config = ModelConfig(vocab_size=64, seq_len=16, hidden=32, heads=2, layers=1)
    assert f"= {mfu.flops_per_token(config):,} (Narayanan et al. 2021" in out, out
    # MFU is model TFLOP/s over the peak, as printed (to the printed digits)
    tflops = float(LINES["model TFLOP/s"].search(out).group(1))
    assert float(mfu_line.group(1)) == pytest.approx(100 * tflops / mfu.NOMINAL_CPU_PEAK,
                                                     rel=0.01)
    # memory: the formulas, the saved bytes measured against them (exactly, on the CPU), and
    # the allocator's peak, which the CPU does not have
    assert re.search(r"^memory formulas: model states [\d.,]+ MiB .* activations [\d.,]+ MiB "
                     r"\(gpt_activation_bytes, .*\); total [\d.,]+ MiB$", out, re.M), out
    ratio = re.search(r"^saved for the backward, measured .*: [\d.,]+ MiB = ([\d.]+) x the "
                      r"activations \+ weight copies formula$", out, re.M)
    assert ratio and float(ratio.group(1)) == 1.0, out
    assert ("peak memory allocated: not measured on the CPU (no allocator counter; "
            "torch.cuda.max_memory_allocated on a GPU)") in out, out
    # one layer alone, and what the planner says of it (nothing, for a CPU)
    layer = re.search(r"^one layer alone \(Block, fwd\+bwd\): ([\d.]+) ms, (\S+) of peak$",
                      out, re.M)
    assert layer and float(layer.group(1)) > 0 and float(layer.group(2)) > 0, out
    assert re.search(r"^planner's layer model: (no prediction for this device|bf16 only)", out,
                     re.M), out


def test_planner_predicts_the_trainers_layer_on_the_gpus_it_knows():
    """The GPU default's layer (hidden 2048, seq 2048, sdpa) on an H100: the planner's layer
    model (fitted to the H100 table) gives a time whose FLOP rate is a plausible fraction of
    the peak, autocast adds a positive share; names it does not know give None."""
    config = ModelConfig(vocab_size=50304, seq_len=2048, hidden=2048, heads=16, layers=24,
                         attention="sdpa")
    layer, cast = mfu.planned_layer_seconds(config, 4, "NVIDIA H100 80GB HBM3")
    per_layer = 4 * 2048 * (6 * 12 * 2048 ** 2 + 12 * 2048 * 2048)  # 6 x 12h^2 x tokens + attn
    assert 0.3 < per_layer / layer / 989e12 < 0.8
    assert 0 < cast < 0.3 * layer
    assert mfu.planned_layer_seconds(config, 4, "NVIDIA GeForce RTX 4090") is None
    explicit = ModelConfig(**{**config.__dict__, "attention": "explicit"})
    assert mfu.planned_layer_seconds(explicit, 4, "NVIDIA H100 80GB HBM3")[0] > layer


# The benchmark's "one layer alone" line, measured with this kit (torch 2.11, CUDA 13) on
# 2026-11-26: (GPU name, micro-batch, ms). The H200's rows are also in the autocast fit.
MEASURED_LAYERS = [("NVIDIA H100 80GB HBM3", 4, 6.061), ("NVIDIA H100 80GB HBM3", 8, 11.427),
                   ("NVIDIA H200", 8, 10.760)]


@pytest.mark.parametrize("device, batch, ms", MEASURED_LAYERS)
def test_planner_is_within_ten_percent_of_the_measured_layer(device, batch, ms):
    config = ModelConfig(vocab_size=50304, seq_len=2048, hidden=2048, heads=16, layers=24,
                         attention="sdpa")
    predicted = sum(mfu.planned_layer_seconds(config, batch, device))
    assert 0.9 < ms * 1e-3 / predicted < 1.1


@pytest.mark.slow  # the benchmark's command line, end to end
def test_peak_option_overrides_the_nominal_cpu_peak():
    out = run_benchmark("--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "8",
                        "--batch", "2", "--vocab", "32", "--steps", "1", "--warmup", "0",
                        "--peak", "0.5")
    match = LINES["MFU"].search(out)
    assert match and float(match.group(2)) == 0.5 and match.group(3) == "--peak", out


def test_cpu_defaults_are_tiny():
    args = mfu.parse_args(["--device", "cpu"])
    assert (args.layers, args.hidden, args.seq, args.dtype, args.attention) == (
        2, 128, 128, "fp32", "sdpa")


def test_compile_option_trains_the_compiled_model(monkeypatch, capsys):
    """``--compile`` trains ``torch.compile(model)`` (here a stand-in that records what it got:
    a real compile takes tens of seconds on a CPU) and needs a warm-up step to compile in."""
    compiled = []

    def fake_compile(model):
        compiled.append(model)
        return model

    monkeypatch.setattr(mfu.torch, "compile", fake_compile)
    mfu.main(["--device", "cpu", "--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "8",
              "--batch", "2", "--vocab", "32", "--steps", "1", "--warmup", "1", "--compile"])
    assert len(compiled) == 1 and isinstance(compiled[0], GPT)
    assert "MFU:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mfu.parse_args(["--device", "cpu", "--compile", "--warmup", "0"])


def test_bf16_weights_train_without_autocast_and_name_their_memory_lines(capsys):
    """``--weights bf16``: the model's parameters are bf16 (fp32 masters in the optimizer), the
    step runs without autocast, and the memory lines say the formulas are autocast's."""
    result = mfu.main(["--device", "cpu", "--layers", "1", "--hidden", "16", "--heads", "2",
                       "--seq", "8", "--batch", "2", "--vocab", "32", "--steps", "2",
                       "--warmup", "1", "--dtype", "bf16", "--weights", "bf16"])
    out = capsys.readouterr().out
    assert "bf16 (bf16 weights)" in out and result["tflops"] > 0, out
    assert "the formulas here are autocast's" in out, out
    with pytest.raises(SystemExit):
        mfu.parse_args(["--device", "cpu", "--weights", "bf16"])  # fp32 on the CPU by default
