"""Naming a graded test's failure after the mistake that explains it.

A wrong tensor is compared with what each known mistake would have produced (computed in the
test, from the single-device model or a formula); the first that matches gives the failure's
likely cause, so the student reads "the bias was added on every rank" rather than "the output
differs".
"""
from __future__ import annotations

import torch

from reference_impl.checks import assert_close


def matching_mistake(actual, mistakes: dict[str, torch.Tensor], atol: float) -> str | None:
    """The description of the first mistake whose result ``actual`` is (allclose), else None."""
    actual = torch.as_tensor(actual).double()
    for description, wrong in mistakes.items():
        wrong = torch.as_tensor(wrong).double()
        if wrong.shape == actual.shape and torch.allclose(actual, wrong, atol=atol, rtol=0):
            return description
    return None


def assert_close_naming(actual, expected, what: str, *, rank: int, atol: float,
                        mistakes: dict[str, torch.Tensor], otherwise: str, **options) -> None:
    """``assert_close``, its likely cause the known mistake ``actual`` matches (else
    ``otherwise``)."""
    cause = matching_mistake(actual, mistakes, atol) or otherwise
    assert_close(actual, expected, what, rank=rank, atol=atol, likely_cause=cause, **options)
