"""A training corpus on disk: token ids split into a training and a validation part.

``load_corpus(path)`` reads any of:

* a folder prepared by ``python -m reference_impl.data.prepare`` (or nanoGPT's
  ``prepare.py``): ``train.bin`` and ``val.bin``, flat arrays of token ids (uint16 by default,
  uint32 when ``meta.json`` says so), opened as NumPy memmaps, so a corpus larger than memory
  is read a batch at a time;
* a text file, or a folder of text files (every regular file that is not binary, in sorted
  order): encoded with the byte-level tokenizer, the last ``VAL_FRACTION`` for validation;
* ``stdlib``: the Python standard library's own top-level modules (``Lib/*.py``), text that
  every machine with Python has, offline.

The validation part is the corpus's tail (nanoGPT's split): never trained on.
"""
from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reference_impl.data.byte_tokenizer import VOCAB_SIZE

VAL_FRACTION = 0.1
STDLIB = "stdlib"  # the corpus every machine has
TOKEN_DTYPES = ("uint8", "uint16", "uint32")
META_FILE, SPLIT_FILES = "meta.json", ("train.bin", "val.bin")


@dataclass(frozen=True)
class Corpus:
    name: str
    train: np.ndarray  # token ids, 1-D (a memmap for prepared corpora)
    val: np.ndarray
    vocab_size: int
    tokenizer: str | None = "bytes"  # how ids become text: "bytes", or None (unknown)

    def fingerprint(self) -> str:
        """A short hash of the token ids' sizes and first and last tokens: what a checkpoint
        records, so a resume refuses another corpus."""
        digest = hashlib.sha256()
        for part in (self.train, self.val):  # the ids, whatever their dtype on disk
            digest.update(str(len(part)).encode())
            digest.update(np.asarray(part[:4096], dtype=np.int64).tobytes())
            digest.update(np.asarray(part[-4096:], dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.name}: {len(self.train):,} training and {len(self.val):,} validation "
                f"tokens, vocabulary {self.vocab_size}")


def stdlib_folder() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def text_files(folder: Path) -> list[Path]:
    """The corpus's files: for ``stdlib`` its top-level modules; else every regular file under
    ``folder`` (links not followed) that holds no NUL byte, in sorted order."""
    if folder == stdlib_folder():
        return sorted(path for path in folder.glob("*.py") if path.is_file())
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and b"\0" not in path.read_bytes()[:8192]:
            found.append(path)
    return found


def read_text_tokens(path: Path) -> np.ndarray:
    """A text file's or a folder's bytes (the byte-level tokens), files joined in order."""
    files = text_files(path) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path} holds no text file")
    return np.frombuffer(b"".join(file.read_bytes() for file in files), dtype=np.uint8)


def split(tokens: np.ndarray, val_fraction: float = VAL_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): the last ``val_fraction`` of the tokens for validation."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"the validation fraction must lie in (0, 1), got {val_fraction}")
    cut = len(tokens) - max(1, int(len(tokens) * val_fraction))
    return tokens[:cut], tokens[cut:]


def read_meta(folder: Path) -> dict:
    meta = {"dtype": "uint16", "vocab_size": None}
    if (folder / META_FILE).exists():
        meta.update(json.loads((folder / META_FILE).read_text()))
    if meta["dtype"] not in TOKEN_DTYPES:
        raise ValueError(f"{folder / META_FILE}: dtype {meta['dtype']!r} is none of {TOKEN_DTYPES}")
    return meta


def load_prepared(folder: Path) -> Corpus:
    """A prepared folder's ``train.bin`` and ``val.bin`` as memmaps."""
    meta = read_meta(folder)
    for name in SPLIT_FILES:
        if (folder / name).stat().st_size == 0:
            raise ValueError(f"{folder / name} is empty: no tokens to read")
    parts = [np.memmap(folder / name, dtype=meta["dtype"], mode="r") for name in SPLIT_FILES]
    vocab = meta["vocab_size"] or int(max(part.max() for part in parts)) + 1
    return Corpus(folder.name, parts[0], parts[1], int(vocab), meta.get("tokenizer"))


def is_prepared(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in SPLIT_FILES)


def load_corpus(path: str | os.PathLike) -> Corpus:
    """The corpus at ``path`` (a prepared folder, a text file or folder, or ``stdlib``)."""
    if str(path) == STDLIB:
        return Corpus(STDLIB, *split(read_text_tokens(stdlib_folder())), VOCAB_SIZE)
    path = Path(path)
    if not path.exists():
        raise ValueError(f"--data {path}: no such file or folder (or give {STDLIB!r}: the "
                         f"Python standard library's source, offline)")
    if is_prepared(path):
        return load_prepared(path)
    return Corpus(path.name, *split(read_text_tokens(path)), VOCAB_SIZE)


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """The entropy, in nats, of the tokens' frequencies: the loss of the best model that ignores
    context, the bar a language model must get below."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
