"""The byte-level tokenizer: a text's UTF-8 bytes are its tokens (vocabulary 256).

Nothing to train or download, every text encodes, and decoding never fails (an incomplete
character at a cut is shown as U+FFFD). The price is length: about one token per character
where a BPE tokenizer (GPT-2's) averages about four characters per token.
"""
from __future__ import annotations

import numpy as np

VOCAB_SIZE = 256


def encode(text: str) -> np.ndarray:
    """``text`` as its UTF-8 bytes, a uint8 array of token ids."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def decode(ids) -> str:
    """Token ids (any integer sequence of 0..255) back to text; bytes that do not form a
    character become U+FFFD."""
    values = [int(i) for i in ids]
    bad = [i for i in values if not 0 <= i < VOCAB_SIZE]
    if bad:
        raise ValueError(f"byte tokens lie in 0..{VOCAB_SIZE - 1}, got {bad[:5]}")
    return bytes(values).decode("utf-8", errors="replace")
