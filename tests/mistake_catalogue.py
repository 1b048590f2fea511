"""The mistakes students make, one entry each, and the graded test that must catch each one.

Every entry is a mutation of the reference solution (the text ``find``, which must occur exactly
once in the student file ``module``'s reference module, becomes ``replace``): handed in as a
submission, the graded tests selected by ``select`` (a ``pytest -k`` expression) in ``lab`` must
fail, and their output must contain ``message``, the words that name the mistake.
``tests/test_mistake_catalogue.py`` hands in every entry and checks both.

This file holds solution lines, so the student handout leaves it out.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    name: str  # what the student did, in a student's words
    lab: str  # "lab2"
    module: str  # the student file, without .py: "tp_layers"
    find: str  # exact text of the reference module (once)
    replace: str  # what the student wrote instead
    select: str  # pytest -k expression: the graded tests that must catch it
    message: str  # a substring of their failure output that names the mistake


# ---------------------------------------------------------------- lab 0 and lab 1
LAB0_LAB1: list[Mistake] = []

# ---------------------------------------------------------------- lab 2 and lab 3
LAB2_LAB3: list[Mistake] = []

# ---------------------------------------------------------------- lab 4
LAB4: list[Mistake] = []

# ---------------------------------------------------------------- lab 5
LAB5: list[Mistake] = []

# ---------------------------------------------------------------- lab 6 and lab 7
LAB6_LAB7: list[Mistake] = []

CATALOGUE = LAB0_LAB1 + LAB2_LAB3 + LAB4 + LAB5 + LAB6_LAB7
