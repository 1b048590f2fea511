"""The configurations a graded check runs over: drawn from the exercise's space, not picked.

:func:`group_layouts` cuts ranks into groups consecutive, strided and permuted; :func:`draw` is
a seeded sample of a product space in which every value of every axis appears at least once.
The seed is fixed for grading (``DEFAULT_SEED``), printed in a failure (:func:`label`) and
reproduced with ``--sweep-seed``. Why: docs/grading.md, 'Public and hidden checks'.
"""
from __future__ import annotations

import itertools
import random

DEFAULT_SEED = 0
LAYOUTS = ("consecutive", "strided", "permuted", "world")
PERMUTATION_TRIES = 50  # shuffles drawn until one gives groups unlike the other layouts


def group_layouts(world: int, size: int, seed: int = DEFAULT_SEED) -> dict[str, list[list[int]]]:
    """{layout name: groups}, each a partition of ``range(world)`` into groups of ``size``
    ranks (each group's ranks in increasing order, as ``new_group`` numbers them). A layout
    that would repeat another (strided with one group; permuted where every shuffle gives
    the consecutive or strided groups) is left out."""
    if size < 1 or world % size:
        raise ValueError(f"groups of {size} ranks cannot partition a world of {world}: the "
                         f"group size must divide the world size")
    count = world // size
    layouts = {"consecutive": [list(range(g * size, (g + 1) * size)) for g in range(count)]}
    if count > 1 and size > 1:
        layouts["strided"] = [list(range(g, world, count)) for g in range(count)]
        rng = random.Random(seed)
        for _ in range(PERMUTATION_TRIES):
            shuffled = rng.sample(range(world), world)
            permuted = sorted(sorted(shuffled[g * size:(g + 1) * size]) for g in range(count))
            if permuted not in layouts.values():
                layouts["permuted"] = permuted
                break
    if count == 1:
        layouts = {"world": layouts["consecutive"]}
    return layouts


def group_of(rank: int, groups: list[list[int]]) -> list[int]:
    """The group of ``groups`` that holds ``rank``."""
    return next(group for group in groups if rank in group)


def draw(space: dict[str, list], seed: int = DEFAULT_SEED, extra: int = 0) -> list[dict]:
    """Configurations of ``space`` (axis -> its values): enough that every value of every axis
    appears at least once (the longest axis's length), plus ``extra`` drawn at random from the
    whole product; seeded, no configuration twice."""
    rng = random.Random(seed)
    axes = list(space)
    columns = []
    rows = max(len(values) for values in space.values())
    for axis in axes:
        values = list(space[axis])
        column = values + [rng.choice(values) for _ in range(rows - len(values))]
        rng.shuffle(column)
        columns.append(column)
    chosen = [dict(zip(axes, values)) for values in zip(*columns)]
    product = [dict(zip(axes, values)) for values in itertools.product(*space.values())]
    rest = [config for config in product if config not in chosen]
    chosen += rng.sample(rest, min(extra, len(rest)))
    unique = []
    for config in chosen:
        if config not in unique:
            unique.append(config)
    return unique


def label(config: dict, seed: int = DEFAULT_SEED) -> str:
    """How a failure names its case: 'seed 0: cp 2, layout strided, dtype bf16' (rerun it with
    ``--sweep-seed 0`` and the test's id)."""
    shown = ", ".join(f"{key} {value}" for key, value in config.items())
    return f"seed {seed}: {shown}"
