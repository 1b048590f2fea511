"""Layouts and models written on the command line: ``key=value,key=value`` or a JSON file.

    --evaluate tp=8,pp=12,v=8,dp=64,cp=1,mb=1,zero=1,recompute=none,attention=flash
    --model layers=96,hidden=12288,heads=96,vocab=51200,seq=2048,tied=1
    --model layers=32,hidden=4096,heads=32,kv_heads=8,vocab=32000,seq=4096,ffn=14336,gated=1,experts=8,top_k=2
    --evaluate tp=2,pp=4,dp=8,ep=8     # experts over 8 of the 8 data-parallel ranks
    --model my_model.json          # the same keys as a JSON object

Every key is checked: an unknown one, a missing one or a value of the wrong kind is an error
that names it.
"""
from __future__ import annotations

import json
from pathlib import Path

from reference_impl.perf.planner.layout import Layout
from reference_impl.perf.planner.model_spec import ModelSpec

LAYOUT_KEYS = {  # the command line's name: (Layout's field, kind)
    "tp": ("tp", int), "pp": ("pp", int), "dp": ("dp", int), "cp": ("cp", int),
    "v": ("v", int), "mb": ("micro_batch", int), "zero": ("zero", int),
    "recompute": ("recompute", str), "attention": ("attention", str),
    "accounting": ("accounting", str), "sp": ("sequence_parallel", bool),
    "tp_overlap": ("tp_comm_overlap", bool), "embedding_in_split": ("embedding_in_split", bool),
    "ep": ("ep", int),
}
LAYOUT_REQUIRED = ("tp", "pp", "dp")
MODEL_KEYS = {
    "name": ("name", str), "layers": ("layers", int), "hidden": ("hidden", int),
    "heads": ("heads", int), "vocab": ("vocab", int), "seq": ("seq_len", int),
    "kv_heads": ("kv_heads", int), "ffn": ("ffn_hidden", int), "gated": ("gated_mlp", bool),
    "tied": ("tied_embeddings", bool), "dropout": ("dropout", bool),
    "experts": ("experts", int), "top_k": ("top_k", int),  # ffn: each expert's width
}
MODEL_REQUIRED = ("layers", "hidden", "heads", "vocab", "seq")


def parse_pairs(text: str) -> dict[str, str]:
    """``a=1,b=2`` as {"a": "1", "b": "2"}, or the object of a JSON file of that name."""
    if text.endswith(".json") or Path(text).is_file():
        try:
            loaded = json.loads(Path(text).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read {text}: {error}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{text}: expected a JSON object of key: value")
        return {str(k): str(v) for k, v in loaded.items()}
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def _convert(key: str, value: str, kind: type):
    if kind is bool:
        if value.lower() not in ("0", "1", "true", "false", "yes", "no"):
            raise ValueError(f"{key} must be 0 or 1 (true/false), got {value!r}")
        return value.lower() in ("1", "true", "yes")
    if kind is int:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{key} must be an integer, got {value!r}") from None
    return None if value.lower() == "none" else value


def _fields(pairs: dict[str, str], keys: dict, required: tuple, what: str) -> dict:
    unknown = sorted(set(pairs) - set(keys))
    if unknown:
        raise ValueError(f"unknown {what} key {', '.join(unknown)}; known: {', '.join(keys)}")
    missing = [key for key in required if key not in pairs]
    if missing:
        raise ValueError(f"the {what} needs {', '.join(missing)} (got {', '.join(pairs) or 'nothing'})")
    return {keys[k][0]: _convert(k, v, keys[k][1]) for k, v in pairs.items()}


def layout_from(text: str) -> Layout:
    """A :class:`Layout` from ``key=value,...`` (LAYOUT_KEYS) or a JSON file."""
    return Layout(**_fields(parse_pairs(text), LAYOUT_KEYS, LAYOUT_REQUIRED, "layout"))


def model_from(text: str) -> ModelSpec:
    """A :class:`ModelSpec` from ``key=value,...`` (MODEL_KEYS) or a JSON file."""
    fields = _fields(parse_pairs(text), MODEL_KEYS, MODEL_REQUIRED, "model")
    fields.setdefault("name", "model")
    return ModelSpec(**fields)
