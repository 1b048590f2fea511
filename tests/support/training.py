"""Training a parallelised GPT (``hybrid/parallelize.py``) against single-device training of the
same GPT on the same global batches: the optimizers, the run on every rank, the oracles, and
the check of losses and weights, and the trainer against one device
(``tests/library/hybrid/test_parallelize.py``, ``test_cp_training.py`` and
``tests/library/llama/``).

Tolerances. fp32: the parallelisms change only the order of additions, so losses and weights
agree to :data:`ATOL` (Adam's eps is 1e-4: see ``test_hybrid.py``). bf16 (``test_bf16.py``'s):
losses to :data:`TOL` of their scale, weights to :data:`STEP_TOL` of the largest change the
steps made; Adam's eps is 1e-2 there, since a gradient made of bf16 rounding noise would
otherwise move a weight by lr with either sign.
"""
from __future__ import annotations

import torch

from reference_impl import train
from reference_impl.checks import assert_close
from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.hybrid.parallelize import build_optimizer, parallelize_gpt
from reference_impl.model import GPT

ATOL = 1e-5
TOL, STEP_TOL = 2e-2, 3e-2  # bf16, as in test_bf16.py
PRECISIONS, OPTIMIZERS = ("fp32", "bf16"), ("adam", "sgd")


def make_optimizer(name, precision="fp32"):
    if name == "adam":  # eps: see the module's docstring
        eps = 1e-4 if precision == "fp32" else 1e-2
        return lambda parameters: torch.optim.Adam(parameters, lr=1e-2, eps=eps)
    return lambda parameters: torch.optim.SGD(parameters, lr=0.5, momentum=0.9)


def train_combinations(gpt, dataset, combinations):
    """On every rank: each combination's (name, TrainingPlan fields, optimizer) losses and
    gathered weights, one after another."""
    results = {}
    for name, fields, optimizer in combinations:
        plan = TrainingPlan(**fields)
        model = parallelize_gpt(gpt, plan, plan.dims.build())
        optim = build_optimizer(model, make_optimizer(optimizer, plan.precision)(model.parameters()))
        losses = [hybrid.train_step(model, tokens, targets, optim).item()
                  for tokens, targets in dataset]
        results[name] = (losses, hybrid.gather_full_state(model))
    return results


def single_device_oracles(gpt, dataset):
    """Single-device training of ``gpt`` on ``dataset``: {(precision, optimizer): (losses,
    final parameters by name)}."""
    return {(precision, optimizer): hybrid.train_single_device(
                gpt, dataset, make_optimizer(optimizer, precision), precision=precision)
            for precision in PRECISIONS for optimizer in OPTIMIZERS}


def check(name, fields, optimizer, rank, result, gpt, oracles, observed):
    """Assert one combination's losses and weights on one rank against the oracle, and record
    the largest differences seen in ``observed[name]`` (loss, weights; bf16: relative)."""
    precision = fields.get("precision", "fp32")
    expected_losses, expected_state = oracles[precision, optimizer]
    steps = len(expected_losses)
    losses, state = result
    assert set(state) == set(expected_state), f"{name}, rank {rank}: parameter names differ"
    initial = dict(gpt.named_parameters())
    loss_error = (torch.tensor(losses) - torch.tensor(expected_losses)).abs().max().item()
    weight_error = 0.0
    if precision == "fp32":
        assert_close(torch.tensor(losses), torch.tensor(expected_losses),
                     f"{name}: the loss of steps 1..{steps}", rank=rank, atol=ATOL)
    else:
        scale = max(abs(x) for x in expected_losses)
        loss_error /= scale
        assert_close(torch.tensor(losses), torch.tensor(expected_losses),
                     f"{name}: the loss of steps 1..{steps} (bf16)", rank=rank,
                     atol=TOL * scale, rtol=0)
    for parameter, expected in expected_state.items():
        change = (expected - initial[parameter].detach()).abs().max().item()
        assert change > 100 * ATOL, f"{parameter} moved by {change:.2g} only: a weak test"
        error = (state[parameter] - expected).abs().max().item()
        if precision == "fp32":
            assert_close(state[parameter], expected, f"{name}: {parameter} after {steps} steps",
                         rank=rank, atol=ATOL)
        else:
            error /= change
            assert_close(state[parameter], expected,
                         f"{name}: {parameter} after {steps} steps (bf16)", rank=rank,
                         atol=STEP_TOL * change, rtol=0)
        weight_error = max(weight_error, error)
    previous = observed.get(name, (0.0, 0.0))
    observed[name] = (max(previous[0], loss_error), max(previous[1], weight_error))


def gpt_with_uneven_norms(config):
    """The GPT of ``config`` (seed 0) with its norms' weights moved away from 1, so that a wrong
    norm gradient shows."""
    torch.manual_seed(0)
    gpt = GPT(config)
    with torch.no_grad():
        for name, parameter in gpt.named_parameters():
            if "ln" in name:
                parameter.add_(0.2 * torch.randn(parameter.shape))
    return gpt


def assert_the_trainer_trains_as_one_device(argv: list[str], what: str):
    """``python -m reference_impl.train`` with ``argv`` gives single-device training's losses on
    the same batches (``train.train_one_device``, to :data:`ATOL`); returns the trainer's parsed
    arguments."""
    result = train.main(argv)
    args = train.parse_args(argv)
    losses, _ = train.train_one_device(args)  # the same optimizer, schedule and clipping
    assert_close(torch.tensor(result["losses"]), torch.tensor(losses), f"the trainer's losses ({what})",
                 atol=ATOL)
    return args
