"""Turn text into a prepared corpus: ``train.bin`` and ``val.bin`` (flat uint16 token ids,
nanoGPT's format) and ``meta.json``, read back as memmaps by ``corpus.load_corpus``.

    python -m reference_impl.data.prepare stdlib data/stdlib
    python -m reference_impl.data.prepare my_text_folder data/mine --val-fraction 0.05
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from reference_impl.data.corpus import (META_FILE, SPLIT_FILES, STDLIB, VAL_FRACTION, Corpus,
                                        load_corpus, read_text_tokens, split, stdlib_folder)
from reference_impl.data.byte_tokenizer import VOCAB_SIZE


def prepare(source: str, out: str | Path, val_fraction: float = VAL_FRACTION) -> Corpus:
    """Write ``source``'s byte-level tokens, split, into the folder ``out``; return it loaded."""
    folder = stdlib_folder() if source == STDLIB else Path(source)
    if not folder.exists():
        raise ValueError(f"{source}: no such file or folder")
    parts = split(read_text_tokens(folder), val_fraction)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in zip(SPLIT_FILES, parts):
        part.astype(np.uint16).tofile(out / name)
    meta = {"dtype": "uint16", "vocab_size": VOCAB_SIZE, "tokenizer": "bytes",
            "source": str(source), "val_fraction": val_fraction}
    (out / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return load_corpus(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.data.prepare",
                                     description=prepare.__doc__)
    parser.add_argument("source", help=f"a text file, a folder of text files, or {STDLIB!r}")
    parser.add_argument("out", help="the folder to write train.bin, val.bin and meta.json into")
    parser.add_argument("--val-fraction", type=float, default=VAL_FRACTION)
    args = parser.parse_args(argv)
    try:
        corpus = prepare(args.source, args.out, args.val_fraction)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {args.out}: {corpus.describe()}")


if __name__ == "__main__":
    main()
