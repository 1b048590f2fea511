"""Each rank's share of every global batch, read from the corpus: the data-parallel sampler.

The corpus's training tokens are cut into windows of seq + 1 tokens (a sample: tokens
``w[:-1]``, targets ``w[1:]``), one every seq tokens. Sample n of the stream is window
``order(epoch)[n mod N]`` of epoch ``n // N``: each epoch a seeded permutation of the N
windows, so every window is seen once an epoch, in an order fixed by the seed alone. Global
batch ``step`` is samples ``step * batch`` ... ``(step + 1) * batch - 1``.

A rank reads only its share (``rank_batch``), as PyTorch's ``DistributedSampler`` and
Megatron-LM's data loaders do: replica r of dp takes the global batch's r-th run of batch/dp
rows (``pipeline_executor.split_batch``, the rule ``parallel_gpt.replica_slice`` cuts an
in-memory batch by), and a context-parallel rank the load-balanced positions of each of them
(``cp.load_balance.token_positions``). Every layout reads the same
global batches, so the losses are one device's, and a resumed run continues with the very
batches it would have read: the stream's position is the number of samples consumed.
"""
from __future__ import annotations

import numpy as np
import torch

from reference_impl.cp.load_balance import token_positions
from reference_impl.pipeline.pipeline_executor import split_batch


def check_windows(name: str, tokens: np.ndarray, seq: int, needed: int) -> int:
    """The number of windows of seq + 1 tokens in ``tokens``; a ValueError if under ``needed``."""
    windows = (len(tokens) - 1) // seq if len(tokens) > seq else 0
    if windows < needed:
        raise ValueError(f"the {name} split has {len(tokens):,} tokens: {windows} windows of "
                         f"--seq {seq} + 1, fewer than the {needed} one batch needs (a shorter "
                         f"--seq, a smaller --batch, or a larger corpus)")
    return windows


class ShardedBatches:
    """The global batches of one split (``tokens``), in the seeded order, and each rank's share.
    ``shuffle=False`` reads the windows in corpus order (validation)."""

    def __init__(self, tokens: np.ndarray, seq: int, batch: int, seed: int = 0,
                 shuffle: bool = True, name: str = "training"):
        self.tokens, self.seq, self.batch, self.seed, self.shuffle = tokens, seq, batch, seed, shuffle
        self.windows = check_windows(name, tokens, seq, batch)
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)

    def window_of(self, sample: int) -> int:
        """The window that sample ``sample`` of the stream reads."""
        epoch, place = divmod(sample, self.windows)
        if not self.shuffle:
            return place
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(self.windows, generator=generator).numpy())
        return int(self._order[1][place])

    def epoch_of(self, step: int) -> float:
        """Epochs completed after ``step`` global batches."""
        return step * self.batch / self.windows

    def rows(self, step: int, replica: int = 0, replicas: int = 1) -> list[int]:
        """The sample numbers of replica ``replica``'s rows of global batch ``step``."""
        if self.batch % replicas:
            raise ValueError(f"--batch {self.batch} does not split over {replicas} replicas")
        samples = torch.arange(step * self.batch, (step + 1) * self.batch)
        return split_batch(samples, replicas)[replica].tolist()

    def rank_batch(self, step: int, context=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, targets) of this rank of ``context`` (a ``ParallelContext``; None: one
        device): its replica's rows, its CP positions of each; int64 tensors of shape
        (batch / dp, seq / cp). Reads only those tokens."""
        replica, replicas, cp, cp_rank = ((0, 1, 1, 0) if context is None else
                                          (context.replica, context.dp, context.cp,
                                           context.coordinates.cp_rank))
        positions = (token_positions(self.seq, cp, cp_rank).numpy() if cp > 1
                     else np.arange(self.seq))
        starts = [self.window_of(sample) * self.seq for sample in self.rows(step, replica, replicas)]
        tokens = np.stack([np.asarray(self.tokens[start + positions]) for start in starts])
        targets = np.stack([np.asarray(self.tokens[start + positions + 1]) for start in starts])
        return torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(targets.astype(np.int64))

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole global batch ``step``: one device's view (the tests' oracle)."""
        return self.rank_batch(step)
