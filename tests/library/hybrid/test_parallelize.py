"""``hybrid/parallelize.py``: every technique of the kit composed on the course's GPT, against
single-device training of the same GPT on the same global batches.

A matrix of small combinations of dp x tp x pp, sequence parallelism (sp), recomputation and
the kind of data parallelism (sync, ddp_hooks, zero1-3), fp32 and bf16, run in two launches
(4 CPU ranks, then 8), several combinations per launch; for each, the loss of every step and
every weight after the steps (gathered to the single-device names) on every rank.

Tolerances. fp32: TP, SP, PP, DP, ZeRO and recomputation change only the order of additions
(recomputation: none at all), so losses and weights agree to atol 1e-5 (``test_hybrid.py``'s;
Adam's eps is 1e-4 for the reason given there). bf16: the kit's (``test_bf16.py``): losses to
2e-2 of their scale, weights to 3e-2 of the largest change the steps made; Adam's eps is 1e-2
there, since a gradient made of bf16 rounding noise would otherwise move a weight by lr with
either sign. Observed on CPU (torch 2.13), largest over ranks and combinations: fp32 losses
4.8e-7, weights 2.7e-7; bf16 losses 1.3e-4 and weights 9.8e-3 of their scales (each
combination's own figures are printed with ``-s``). Then the refused combinations, each with
the rule and the numbers in its message, and the trainer's flags end to end.
"""
import pytest
import torch

from reference_impl import train
from reference_impl.checks import assert_close
from reference_impl.hybrid import parallel_3d as hybrid
from reference_impl.hybrid.parallelize import ParallelDims, build_optimizer, parallelize_gpt
from reference_impl.model import GPT, ModelConfig

ATOL = 1e-5
TOL, STEP_TOL = 2e-2, 3e-2  # bf16, as in test_bf16.py
STEPS, BATCH = 3, 8
CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=2)
TIMEOUT = 120  # one launch of 8 ranks on 2 cores takes seconds, far from this

# (name, ParallelDims fields, optimizer); the world is dp * tp * pp
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


def make_optimizer(name, precision="fp32"):
    if name == "adam":  # eps: see the module's docstring
        eps = 1e-4 if precision == "fp32" else 1e-2
        return lambda parameters: torch.optim.Adam(parameters, lr=1e-2, eps=eps)
    return lambda parameters: torch.optim.SGD(parameters, lr=0.5, momentum=0.9)


def train_combinations(gpt, dataset, combinations):
    """On every rank: each combination's losses and gathered weights, one after another."""
    results = {}
    for name, fields, optimizer in combinations:
        dims = ParallelDims(**fields)
        context = hybrid.initialize_parallelism(dims.dp, dims.tp, dims.pp)
        model = parallelize_gpt(gpt, dims, context)
        optim = build_optimizer(model, make_optimizer(optimizer, dims.precision))
        losses = [hybrid.train_step(model, tokens, targets, optim).item()
                  for tokens, targets in dataset]
        results[name] = (losses, hybrid.gather_full_state(model))
    return results


@pytest.fixture(scope="module")
def reference():
    """The GPT, the batches and single-device training per (precision, optimizer)."""
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    dataset = hybrid.make_dataset(0, STEPS, BATCH, CONFIG.seq_len, CONFIG.vocab_size)
    oracles = {(precision, optimizer): hybrid.train_single_device(
                   gpt, dataset, make_optimizer(optimizer, precision), precision=precision)
               for precision in ("fp32", "bf16") for optimizer in ("adam", "sgd")}
    return gpt, dataset, oracles


def check(name, fields, optimizer, rank, result, gpt, oracles):
    precision = fields.get("precision", "fp32")
    expected_losses, expected_state = oracles[precision, optimizer]
    losses, state = result
    assert set(state) == set(expected_state), f"{name}, rank {rank}: parameter names differ"
    initial = dict(gpt.named_parameters())
    loss_error = (torch.tensor(losses) - torch.tensor(expected_losses)).abs().max().item()
    weight_error = 0.0
    if precision == "fp32":
        assert_close(torch.tensor(losses), torch.tensor(expected_losses),
                     f"{name}: the loss of steps 1..{STEPS}", rank=rank, atol=ATOL)
    else:
        scale = max(abs(x) for x in expected_losses)
        loss_error /= scale
        assert_close(torch.tensor(losses), torch.tensor(expected_losses),
                     f"{name}: the loss of steps 1..{STEPS} (bf16)", rank=rank,
                     atol=TOL * scale, rtol=0)
    for parameter, expected in expected_state.items():
        change = (expected - initial[parameter].detach()).abs().max().item()
        assert change > 100 * ATOL, f"{parameter} moved by {change:.2g} only: a weak test"
        error = (state[parameter] - expected).abs().max().item()
        if precision == "fp32":
            assert_close(state[parameter], expected, f"{name}: {parameter} after {STEPS} steps",
                         rank=rank, atol=ATOL)
        else:
            error /= change
            assert_close(state[parameter], expected,
                         f"{name}: {parameter} after {STEPS} steps (bf16)", rank=rank,
                         atol=STEP_TOL * change, rtol=0)
        weight_error = max(weight_error, error)
    previous = OBSERVED.get(name, (0.0, 0.0))
    OBSERVED[name] = (max(previous[0], loss_error), max(previous[1], weight_error))


@pytest.mark.parametrize("world", sorted(MATRIX))
def test_compositions_match_single_device_training(run_on_ranks, reference, world):
    gpt, dataset, oracles = reference
    combinations = MATRIX[world]
    results = run_on_ranks(train_combinations, world, gpt, dataset, combinations,
                           timeout=TIMEOUT)
    for rank, by_name in enumerate(results):
        for name, fields, optimizer in combinations:
            check(name, fields, optimizer, rank, by_name[name], gpt, oracles)
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
        ParallelDims(**fields)


@pytest.mark.parametrize("fields, config, batch, message", [
    (dict(tp=4, sp=True), ModelConfig(seq_len=10, heads=4, hidden=32), None,
     "seq_len 10 is not divisible by tp = 4"),
    (dict(tp=4), ModelConfig(heads=2, hidden=32), None, "heads 2 is not divisible by tp = 4"),
    (dict(dp=2, microbatches=3), ModelConfig(), 8,
     "the global batch of 8 samples is not divisible by dp x microbatches = 2 x 3"),
    (dict(pp=4, chunks=2, schedule="interleaved"), ModelConfig(layers=2), None,
     "4 layers cannot fill pp x chunks = 4 x 2 = 8 pipeline stages"),
])
def test_model_shapes_the_dimensions_cannot_split_are_refused(fields, config, batch, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(**fields).check_model(config, batch)


@pytest.mark.parametrize("argv, message", [
    (["--dp", "2", "--dp-kind", "zero1", "--optimizer", "sgd"],
     "dp_kind zero1 shards Adam's state"),
    (["--dp", "2", "--dp-kind", "zero2", "--checkpoint-dir", "unused"],
     "checkpoints with --dp-kind zero2"),
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
    result = train.main(argv)
    args = train.parse_args(argv)
    torch.manual_seed(args.seed)
    gpt = GPT(train.model_config(args))
    dataset = hybrid.make_dataset(args.seed, args.steps, args.batch, args.seq, args.vocab)
    losses, _ = hybrid.train_single_device(gpt, dataset, lambda p: train.make_optimizer(args, p))
    assert_close(torch.tensor(result["losses"]), torch.tensor(losses),
                 "the trainer's losses (dp 2 x tp 2, sp, zero1, selective)", atol=ATOL)
