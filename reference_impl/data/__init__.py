"""Training data on disk: a corpus (prepared token arrays, text, or the Python standard
library's source), the byte-level tokenizer, and each rank's share of every global batch."""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "byte_tokenizer": ["VOCAB_SIZE", "decode", "encode"],
    "corpus": ["STDLIB", "Corpus", "load_corpus", "unigram_entropy"],
    "prepare": ["prepare"],
    "sharded_batches": ["ShardedBatches"],
})
