"""The load-balanced sequence layout of causal context parallelism.

Cut in cp contiguous pieces, a causal sequence gives the last rank the most work (its queries
see every earlier key) and the first the least. Megatron-core and NVIDIA's TransformerEngine
(context parallelism, "CP") cut it instead into 2*cp equal chunks and give every rank two of
them, one early and one late, chosen so that every rank attends to the same number of (query,
key) pairs (:func:`chunks_of_rank`). A rank's tokens are its two chunks side by side, the
earlier first; :func:`token_positions` gives their places in
the whole sequence (for rotary embeddings and the causal mask).
"""
from __future__ import annotations

import torch


def check_sequence(seq: int, cp: int) -> None:
    """ValueError unless ``seq`` splits into 2*cp equal chunks."""
    if cp < 1:
        raise ValueError(f"the context-parallel size must be at least 1, got cp = {cp}")
    if seq % (2 * cp):
        raise ValueError(f"the load-balanced layout cuts the sequence into 2*cp = {2 * cp} chunks: "
                         f"seq {seq} is not divisible by {2 * cp}")


def chunks_of_rank(cp: int, rank: int) -> tuple[int, int]:
    """The two chunks of the 2*cp that rank ``rank`` holds, the earlier first: one early and one
    late, every rank with the same causal work."""
    # BEGIN SOLUTION lab8: chunks_of_rank (hint: "chunks and positions" in the notebook)
    return rank, 2 * cp - 1 - rank
    # END SOLUTION


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s share of ``x`` along ``dim`` (the sequence): the entries at its
    :func:`token_positions`, in that order."""
    return x.index_select(dim, token_positions(x.shape[dim], cp, rank, device=x.device))


def unshard_sequence(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The whole tensor again from every rank's share (``shards[r]`` is rank r's), in order."""
    cp = len(shards)
    chunks = [None] * (2 * cp)
    for rank, shard in enumerate(shards):
        first, second = chunks_of_rank(cp, rank)
        chunks[first], chunks[second] = shard.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)


def token_positions(seq: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """The global positions (int64) of rank ``rank``'s seq / cp tokens, in the order it holds them."""
    check_sequence(seq, cp)
    # BEGIN SOLUTION lab8: token_positions (hint: "chunks and positions" in the notebook)
    chunk = seq // (2 * cp)
    return torch.cat([torch.arange(index * chunk, (index + 1) * chunk, device=device)
                      for index in chunks_of_rank(cp, rank)])
    # END SOLUTION


def visible_part(cp: int, rank: int, owner: int, seq_local: int) -> tuple[slice, slice, bool]:
    """Which of rank ``rank``'s queries see which of rank ``owner``'s keys, as (query slice,
    key slice, whether a causal mask is needed inside), over the two ranks' seq_local tokens.
    The slices hold every pair whose key position is at most its query position; without a
    mask, only such pairs. The mask (this rank's positions for queries and keys) is right on
    the rank's own block alone; of any other block the visible part is a whole rectangle, half
    of the block (the notebook's section 3 derives which half from the chunks' places)."""
    half = seq_local // 2
    # BEGIN SOLUTION lab8: visible_part (hint: "what is visible" in the notebook)
    if owner == rank:
        return slice(0, seq_local), slice(0, seq_local), True
    if owner < rank:
        return slice(0, seq_local), slice(0, half), False
    return slice(half, seq_local), slice(0, seq_local), False
    # END SOLUTION
