"""Compare a parallel result with the single-device reference, and say what differs.

Every test of the course, and the self-checks in the notebooks, go through
:func:`assert_close`, so a failure always reads the same way: which tensor, on which rank,
the largest absolute error against the tolerance, and the likely cause.
"""
from __future__ import annotations

import hashlib
import traceback
from pathlib import Path

import torch


def assert_close(actual, expected, what: str, *, rank: int | None = None, atol: float = 1e-6,
                 rtol: float = 1e-6, likely_cause: str = "",
                 against: str = "the single-device reference") -> None:
    """Raise AssertionError unless ``actual`` is allclose to ``expected`` (|a - e| <= atol + rtol*|e|)."""
    where = f"{what}" + (f" on rank {rank}" if rank is not None else "")
    cause = f" Likely cause: {likely_cause}" if likely_cause else ""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"{where} has shape {tuple(actual.shape)}, {against} has "
                             f"{tuple(expected.shape)}.{cause}")
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    if not torch.allclose(actual, expected, atol=atol, rtol=rtol):
        error = (actual - expected).abs()
        worst = tuple(int(i) for i in torch.unravel_index(error.argmax(), error.shape))
        raise AssertionError(
            f"{where} differs from {against}: max abs error "
            f"{error.max().item():.3g} at index {worst} (atol {atol:g}, rtol {rtol:g}); "
            f"{int((~torch.isclose(actual, expected, atol=atol, rtol=rtol)).sum())} of "
            f"{actual.numel()} elements off.{cause}")


def matching_mistake(actual, mistakes: dict[str, torch.Tensor], atol: float) -> str | None:
    """The description of the first known mistake whose result (computed by the caller, from
    the single-device model or a formula) ``actual`` is, else None."""
    actual = torch.as_tensor(actual).detach().cpu().double()
    for description, wrong in mistakes.items():
        wrong = torch.as_tensor(wrong).detach().cpu().double()
        if wrong.shape == actual.shape and torch.allclose(actual, wrong, atol=atol, rtol=0):
            return description
    return None


def assert_close_naming(actual, expected, what: str, *, mistakes: dict[str, torch.Tensor],
                        otherwise: str, atol: float = 1e-6, rtol: float = 1e-6,
                        where: dict[str, torch.Tensor] | None = None, **options) -> None:
    """``assert_close`` whose likely cause is the known mistake ``actual`` matches, else what
    the failing values show (:func:`difference_evidence`, with ``where``) and ``otherwise``:
    the student reads "the bias was added on every rank", not "the output differs"."""
    cause = matching_mistake(actual, mistakes, atol)
    if cause is None:
        shown = difference_evidence(actual, expected, atol, rtol, where)
        cause = f"{shown} {otherwise}" if shown else otherwise
    assert_close(actual, expected, what, atol=atol, rtol=rtol, likely_cause=cause, **options)


def difference_evidence(actual, expected, atol: float, rtol: float = 0.0,
                        where: dict[str, torch.Tensor] | None = None) -> str:
    """What the failing values show, in a sentence ('' when they agree or say nothing): which
    elements are off (one of ``where``'s boolean masks, of ``expected``'s shape, when it is
    exactly them: ``{"tokens whose target is the first logit of a slice": mask}``), and how they
    relate to the right values (the same factor or the same offset everywhere they are off)."""
    actual = torch.as_tensor(actual).detach().cpu().double()
    expected = torch.as_tensor(expected).detach().cpu().double()
    if actual.shape != expected.shape:
        return ""
    off = ~torch.isclose(actual, expected, atol=atol, rtol=rtol)
    if not off.any() or not torch.isfinite(actual).all():
        return ""
    found = []
    for name, mask in (where or {}).items():
        mask = torch.as_tensor(mask, dtype=torch.bool).cpu()
        if mask.shape == off.shape and torch.equal(mask, off):
            found.append(f"exactly the {name} are off ({int(off.sum())} of {off.numel()}).")
            break
    else:
        if not off.all():
            found.append(f"{int(off.sum())} of {off.numel()} elements are off.")
    wrong, right = actual[off], expected[off]
    if right.abs().min() > atol:
        ratio = wrong / right
        if torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-3, atol=1e-6):
            found.append(f"Where they are off they are {ratio[0].item():.4g} times the right "
                         "values.")
            return " ".join(found)
    offset = wrong - right
    if offset.numel() > 1 and torch.allclose(offset, offset[0].expand_as(offset), atol=atol):
        found.append(f"Where they are off they are the right values plus {offset[0].item():.4g}.")
    return " ".join(found)


def attempt(call):
    """What ``call()`` returns, or its exception as text (``"ValueError: ..."``): a rank's error
    kept as data, so that the test reports it with the rank and the case it happened in."""
    try:
        return call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def raised_in(error: BaseException, file_name: str) -> str | None:
    """The function of the file ``file_name`` (a submission's module) innermost in ``error``'s
    traceback, or None: a test names the function that raised, not only the error."""
    names = [frame.name for frame in traceback.extract_tb(error.__traceback__)
             if Path(frame.filename).name == file_name]
    return names[-1] if names else None


def digest(value) -> str:
    """A fingerprint of a value's text: equal values, equal fingerprints, and the value cannot be
    read back. A notebook checks a prediction against it without printing the answer."""
    return hashlib.sha256(str(value).encode()).hexdigest()[:16]
