"""Check a parallel module against the single-device module it was built from.

On the same input and upstream gradient compare, in order, the output, the input's gradient,
every parameter's gradient (gathered to full shape) and every parameter after one SGD step, and
report the first difference with its likely cause. :func:`one_step_pairs` runs on every rank
(split for graded tests into :func:`reference_step` and :func:`parallel_pairs`);
:func:`assert_equivalent` runs in the parent and names the rank; :func:`parameters_of` and
:func:`source_pairs` catch a parameter shared with the original. Details: docs/library.md,
'Tensor parallelism'.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from reference_impl.checks import assert_close, difference_evidence, matching_mistake
from reference_impl.model.precision import autocast
from reference_impl.tp.tp_layers import full_state

LIKELY_CAUSES = {
    "output": "the forward pass: how the weights are split, or the all-reduce after the "
              "row-parallel layer (missing, or done twice)",
    "input grad": "the output matches, so the forward is right; the input's gradient is not: is "
                  "the backward all-reduce of copy_to_tp missing (each rank then has only its "
                  "shard's part)?",
    "grad": "the output and the input's gradient match; this parameter's gradient does not: "
            "is its shard, or its gathering, in the wrong order?",
    "step": "the gradients match, so the optimizer step differs: is a parameter missing from "
            "the optimizer, or updated twice?",
    "source": "the parallel module shares this parameter with the single-device module it was "
              "built from (the same tensor, not a copy of it): its backward and its step went "
              "into the original too. Give the parallel module its own copy",
}
SOURCE = "the single-device module's "  # what source_pairs' checks are called, before the name


def one_step_pairs(reference: nn.Module, parallel: nn.Module, x: torch.Tensor, group=None,
                   **step) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Forward, backward and one SGD step on both modules; (what, parallel, reference) triples.
    ``step``: ``lr`` (0.1), ``seed`` of the upstream gradient (0), ``precision`` ("fp32";
    "bf16": both forwards under bf16 autocast, ``precision.py``)."""
    return parallel_pairs(parallel, x, reference_step(reference, x, **step), group, **step)


def reference_step(reference: nn.Module, x: torch.Tensor, **step) -> dict[str, torch.Tensor]:
    """:func:`one_step` of a copy of the single-device module (the caller's is left as it
    was). A graded test calls it before it loads the submission, so that no reference number
    is computed after a submission's code has run in the process."""
    return one_step(copy.deepcopy(reference), x, **step)


def parallel_pairs(parallel: nn.Module, x: torch.Tensor, expected: dict[str, torch.Tensor],
                   group=None, **step) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(what, parallel, reference) triples: :func:`one_step` of ``parallel`` beside
    ``expected``, the reference's (:func:`reference_step`, with the same ``x`` and ``step``)."""
    found = one_step(parallel, x, group, **step)
    if found.keys() != expected.keys():
        raise ValueError(
            "the parallel module's parameters are not the single-device module's: missing "
            f"{sorted(expected.keys() - found.keys())}, extra "
            f"{sorted(found.keys() - expected.keys())} (a parallel module keeps the "
            "single-device names, so that its weights pair up)")
    return [(what, value, expected[what]) for what, value in found.items()]


@torch.no_grad()
def as_if_trained(module: nn.Module, scale: float = 0.02) -> nn.Module:
    """``module`` with seeded noise added to every parameter (from the global generator): as
    initialised, norms are all ones and zeros, so a parallel module that takes one norm for
    another matches its reference; after training no two parameters are equal."""
    for parameter in module.parameters():
        parameter.add_(scale * torch.randn_like(parameter))
    return module


def parameters_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of ``module``'s parameters by name, on the CPU: taken before the parallel module
    is built from it, for :func:`source_pairs`."""
    return {name: p.detach().cpu().clone() for name, p in module.named_parameters()}


def source_pairs(source: nn.Module, before: dict[str, torch.Tensor]):
    """(what, now, before) triples: every parameter of the module the parallel one was built
    from, after the parallel module's step, beside its value before (:func:`parameters_of`)."""
    return [(f"{SOURCE}{name} after the parallel step", p.detach().cpu().clone(), before[name])
            for name, p in source.named_parameters()]


def one_step(module: nn.Module, x: torch.Tensor, group=None, lr: float = 0.1, seed: int = 0,
             precision: str = "fp32") -> dict[str, torch.Tensor]:
    """The output, the input's gradient, every parameter's gradient and every parameter after
    one SGD step, gathered to single-device shapes over ``group`` (TP-sharded parameters), on
    the CPU. The upstream gradient is fixed by ``seed``."""
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    with autocast(precision, x.device):
        output = module(x)
    upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed))
    output.backward(upstream.to(x.device, output.dtype))
    found = {"output": output}
    if x.is_floating_point():
        found["input grad"] = x.grad
    found.update((f"grad of {name}", gradient)
                 for name, gradient in full_state(module, group, grads=True).items())
    torch.optim.SGD(module.parameters(), lr=lr).step()
    found.update((f"{name} after a step", value) for name, value in full_state(module, group).items())
    return {what: None if value is None else value.detach().cpu() for what, value in found.items()}


def likely_cause(what: str) -> str:
    if what in LIKELY_CAUSES:
        return LIKELY_CAUSES[what]
    if what.startswith(SOURCE):
        return LIKELY_CAUSES["source"]
    return LIKELY_CAUSES["grad" if what.startswith("grad of") else "step"]


def _close(parallel, reference, atol: float, rtol: float) -> bool:
    parallel, reference = torch.as_tensor(parallel), torch.as_tensor(reference)
    return parallel.shape == reference.shape and torch.allclose(
        parallel.detach().cpu().double(), reference.detach().cpu().double(), atol=atol, rtol=rtol)


def assert_equivalent(pairs_by_rank, atol: float, rtol: float = 0.0,
                      mistakes: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
    """Raise on the first (rank, check) whose parallel value differs from the reference. Its
    likely cause is, in this order: a known mistake whose result it is (``mistakes``: by check,
    {description: what that mistake computes}, from the single-device model), else what the
    values show (which ranks agree, which elements are off and how) and the check's usual
    suspect (:data:`LIKELY_CAUSES`)."""
    failing = {}
    for rank, pairs in enumerate(pairs_by_rank):
        for what, parallel, reference in pairs:
            if not _close(parallel, reference, atol, rtol):
                failing.setdefault(what, []).append((rank, parallel, reference))
    if not failing:
        return
    ranks = len(pairs_by_rank)
    order = list(dict.fromkeys(what for pairs in pairs_by_rank for what, _, _ in pairs))
    for what in (what for what in order if what in failing):
        rank, parallel, reference = failing[what][0]
        known = matching_mistake(parallel, (mistakes or {}).get(what, {}), atol)
        if known is None:
            bad = [r for r, _, _ in failing[what]]
            shown = [f"ranks {bad} differ, the others agree." if len(bad) < ranks else "",
                     difference_evidence(parallel, reference, atol, rtol)]
            known = " ".join(part for part in shown if part)
            known = f"{known} Usual suspect: {likely_cause(what)}" if known else likely_cause(what)
        assert_close(parallel, reference, what, rank=rank, atol=atol, rtol=rtol,
                     likely_cause=known)


def train_on_averaged_gradients(module: nn.Module, optimizer: torch.optim.Optimizer, steps: int,
                                replicas: int, batch) -> dict[str, torch.Tensor]:
    """What ``replicas`` data-parallel ranks compute, on one device: at every step the gradient
    averaged over the replicas' batches (``batch(step, replica)`` gives (x, upstream gradient)),
    then one optimizer step. Returns the parameters after the last step, by name."""
    for step in range(steps):
        grads = []
        for replica in range(replicas):
            module.zero_grad()
            x, upstream = batch(step, replica)
            module(x).backward(upstream)
            grads.append([parameter.grad.clone() for parameter in module.parameters()])
        for index, parameter in enumerate(module.parameters()):
            parameter.grad = sum(g[index] for g in grads) / replicas
        optimizer.step()
    return {name: parameter.detach() for name, parameter in module.named_parameters()}
