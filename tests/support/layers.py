"""The library's layers, lowest first: what ``tests/library/test_import_layers.py`` checks the
imports against, and what ``tests/library/test_trainer_path.py`` counts climbs by."""

# Each package (or module at the top of reference_impl/) and its layer, lowest first: a module
# imports from its own layer and the layers below, never from a layer above.
LAYERS = {
    "reference_impl": 0,  # the package's own __init__: its docstring
    "lazy_exports": 0,  # the packages' lazy public names
    "comm": 0,  # devices, the launcher, collectives, rank groups
    "model": 1,  # the single-device model
    "toys": 1, "checks": 1,
    "tp": 2, "cp": 2, "memory": 2,  # one dimension each, and activation memory
    "equivalence": 3,  # checks a parallel layer (tp) against the single-device one
    "moe": 3,
    "pipeline": 4,
    "data": 4,  # a corpus on disk, each rank's share of every batch (split_batch, cp's layout)
    "hybrid": 5,
    "perf": 6,
    "figures": 7,
    "train": 8, "benchmarks": 8, "course": 8,  # entry points: they may import anything
}


def layer_of(module: str) -> int:
    """``reference_impl.hybrid.dp_kinds.kind`` -> the layer of ``hybrid``."""
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else parts[0]]
