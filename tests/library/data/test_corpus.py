"""The corpus on disk (``data/corpus.py``, ``data/prepare.py``), the byte-level tokenizer and
the sharded batches (``data/sharded_batches.py``): what is read, in which order, by which rank,
against the global batch one device reads. No process group: a rank is its coordinates."""
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from reference_impl.data import ShardedBatches, decode, encode, load_corpus, prepare, unigram_entropy
from reference_impl.data.corpus import STDLIB, split
from reference_impl.hybrid.parallel_gpt import replica_slice


def write_text(path, size=3000, seed=0):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "é", "def", "(x):", "\n"]
    text = " ".join(rng.choice(words, size)).encode()[:size].decode("utf-8", "ignore")
    path.write_text(text, encoding="utf-8")
    return text


def rank(dp=1, replica=0, cp=1, cp_rank=0):
    """What ``ShardedBatches`` and ``replica_slice`` read of a ``ParallelContext``."""
    return SimpleNamespace(dp=dp, replica=replica, cp=cp,
                           coordinates=SimpleNamespace(cp_rank=cp_rank))


def test_bytes_are_the_tokens_and_decoding_never_fails():
    text = "héllo, wörld\n"
    ids = encode(text)
    assert ids.dtype == np.uint8 and len(ids) == len(text.encode()) and decode(ids) == text
    assert decode(encode("é")[:1]) == "\ufffd", "half a character decodes to U+FFFD"
    with pytest.raises(ValueError, match="byte tokens lie in 0..255, got \\[256\\]"):
        decode([1, 256])


def test_a_text_file_and_a_folder_split_their_tail_for_validation(tmp_path):
    text = write_text(tmp_path / "a.txt")
    corpus = load_corpus(tmp_path / "a.txt")
    whole = np.concatenate([corpus.train, corpus.val])
    assert bytes(whole.tolist()) == text.encode() and corpus.vocab_size == 256
    assert len(corpus.val) == int(len(whole) * 0.1), "the last tenth is the validation split"
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "b.md").write_text("second\n")
    (folder / "a.py").write_text("first\n")
    (folder / "image.bin").write_bytes(b"\x89PNG\0\0binary")
    os.symlink(tmp_path / "a.txt", folder / "link.txt")
    corpus = load_corpus(folder)
    assert bytes(np.concatenate([corpus.train, corpus.val]).tolist()) == b"first\nsecond\n", (
        "files in sorted order; binary files and links left out")


def test_prepare_writes_nanogpt_arrays_that_load_as_memmaps(tmp_path):
    write_text(tmp_path / "a.txt")
    text_corpus = load_corpus(tmp_path / "a.txt")
    prepared = prepare(str(tmp_path / "a.txt"), tmp_path / "prepared")
    assert isinstance(prepared.train, np.memmap) and prepared.train.dtype == np.uint16
    assert np.array_equal(prepared.train, text_corpus.train)
    assert np.array_equal(prepared.val, text_corpus.val)
    assert json.loads((tmp_path / "prepared" / "meta.json").read_text())["vocab_size"] == 256
    assert prepared.tokenizer == "bytes" and prepared.fingerprint() == text_corpus.fingerprint()


def test_arrays_without_meta_are_uint16_and_uint32_with_it(tmp_path):
    folder = tmp_path / "ids"
    folder.mkdir()
    np.arange(1000, dtype=np.uint16).tofile(folder / "train.bin")
    np.arange(50, dtype=np.uint16).tofile(folder / "val.bin")
    corpus = load_corpus(folder)
    assert corpus.vocab_size == 1000 and corpus.tokenizer is None, "vocabulary: largest id + 1"
    np.array([70_000, 1], dtype=np.uint32).tofile(folder / "val.bin")
    np.arange(100, dtype=np.uint32).tofile(folder / "train.bin")
    (folder / "meta.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 70_001}))
    corpus = load_corpus(folder)
    assert corpus.val.tolist() == [70_000, 1] and corpus.vocab_size == 70_001
    (folder / "meta.json").write_text(json.dumps({"dtype": "int8"}))
    with pytest.raises(ValueError, match="dtype 'int8' is none of"):
        load_corpus(folder)


def test_the_offline_corpus_is_the_standard_library(tmp_path):
    corpus = load_corpus(STDLIB)
    assert corpus.name == STDLIB and len(corpus.train) > 1_000_000
    assert b"def " in bytes(corpus.val[:20_000].tolist())
    entropy = unigram_entropy(corpus.train, 256)
    assert 2.5 < entropy < 4.0, f"Python source's bytes: {entropy:.3f} nats"
    with pytest.raises(ValueError, match="no such file or folder"):
        load_corpus(tmp_path / "missing")


def test_unigram_entropy_is_the_frequencies_entropy():
    assert unigram_entropy(np.array([0, 1, 2, 3] * 5), 8) == pytest.approx(math.log(4))
    assert unigram_entropy(np.array([7] * 9), 8) == 0.0
    with pytest.raises(ValueError, match="must lie in \\(0, 1\\)"):
        split(np.arange(10), 1.0)


def test_an_epoch_reads_every_window_once_in_a_seeded_order():
    tokens = np.arange(8 * 37 + 1, dtype=np.uint16)  # 37 windows of seq 8
    data = ShardedBatches(tokens, seq=8, batch=4, seed=3)
    assert data.windows == 37
    firsts = [int(t) for step in range(10) for t in data.global_batch(step)[0][:, 0]]
    first_epoch = sorted(first // 8 for first in firsts[:37])
    assert first_epoch == list(range(37)), "each window once an epoch"
    again = ShardedBatches(tokens, seq=8, batch=4, seed=3)
    assert [int(t) for t in again.global_batch(9)[0][:, 0]] == firsts[36:40], "a function of the seed"
    other = ShardedBatches(tokens, seq=8, batch=4, seed=4)
    assert not torch.equal(other.global_batch(0)[0], data.global_batch(0)[0])
    assert firsts[:37] != firsts[37:40] + firsts[:34], "the next epoch is another order"
    tokens_, targets = data.global_batch(5)
    assert torch.equal(tokens_[:, 1:], targets[:, :-1]) and tokens_.dtype == torch.int64
    assert torch.equal(targets, tokens_ + 1), "targets are the next tokens"


@pytest.mark.parametrize("dp, cp", [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)])
def test_each_rank_reads_its_share_of_the_global_batch(dp, cp):
    """Each (replica, CP rank) reads exactly ``replica_slice`` of the global batch: the rows of
    its replica, the load-balanced positions of its CP rank."""
    tokens = np.random.default_rng(0).integers(0, 256, 5000).astype(np.uint16)
    data = ShardedBatches(tokens, seq=16, batch=8, seed=1)
    for step in (0, 3, 40):  # step 40 is in the second epoch
        whole = data.global_batch(step)
        for replica in range(dp):
            for cp_rank in range(cp):
                mine = rank(dp, replica, cp, cp_rank)
                share = data.rank_batch(step, mine)
                for got, expected in zip(share, whole):
                    assert torch.equal(got, replica_slice(expected, mine)), (
                        f"step {step}, replica {replica} of {dp}, cp rank {cp_rank} of {cp}")


def test_validation_reads_in_corpus_order_and_short_splits_are_refused():
    tokens = np.arange(8 * 10 + 1, dtype=np.uint16)
    val = ShardedBatches(tokens, seq=8, batch=5, shuffle=False, name="validation")
    assert val.global_batch(1)[0][:, 0].tolist() == [40, 48, 56, 64, 72]
    with pytest.raises(ValueError, match="the validation split has 81 tokens: 10 windows of "
                                         "--seq 8 \\+ 1, fewer than the 16 one batch needs"):
        ShardedBatches(tokens, seq=8, batch=16, name="validation")
    with pytest.raises(ValueError, match="--batch 5 does not split over 2 replicas"):
        val.rank_batch(0, rank(dp=2))
