"""All-reduce built by hand from point-to-point sends and receives: the ring, and recursive
doubling.

* The ring (``ring_chunks``, ``ring_reduce_scatter``, ``ring_all_gather``): the tensor in n
  chunks, a reduce-scatter then an all-gather of n-1 steps each, every rank sending one chunk
  per step to its right neighbour; after the reduce-scatter rank r holds the full sum of chunk
  (r + 1) mod n. Each rank sends 2(n-1)/n S bytes whatever n: bandwidth-optimal, and the cost
  of ``alpha_beta.py``.
* Recursive doubling (Thakur, Rabenseifner and Gropp 2005), n = 2^k ranks: log2(n) swaps of
  the whole tensor with a partner; fewer latencies, more bytes (``alpha_beta.faster_all_reduce``).

The derivations, what every rank holds after each step: lab 0's notebook, sections "3. The
ring all-reduce, by hand" and "5. Ring or recursive doubling? Let the model choose".
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def ring_chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n views into the 1-d ``flat`` whose lengths sum to its length and differ by at most one,
    the longer ones first (a chunk may be empty when there are fewer elements than ranks)."""
    # BEGIN SOLUTION lab0: ring_chunks (hint: "ring chunks and phases" in the notebook)
    base, extra = divmod(flat.numel(), n)
    lengths = [base + 1 if index < extra else base for index in range(n)]
    return list(flat.split(lengths))
    # END SOLUTION


def _swap(send: torch.Tensor, receive: torch.Tensor, to: int, source: int, group) -> None:
    """Send ``send`` to group rank ``to`` while receiving ``receive`` from group rank ``source``
    (non-blocking send first, so that two ranks sending to each other do not deadlock)."""
    to, source = ((dist.get_global_rank(group, to), dist.get_global_rank(group, source))
                  if group else (to, source))
    outgoing = dist.isend(send.contiguous(), to, group=group)
    dist.recv(receive, source, group=group)
    outgoing.wait()


def _exchange(send: torch.Tensor, receive: torch.Tensor, group) -> None:
    """Send ``send`` to the right neighbour while receiving ``receive`` from the left one."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    _swap(send, receive, (rank + 1) % n, (rank - 1) % n, group)


def ring_reduce_scatter(chunks: list[torch.Tensor], group=None) -> None:
    """Phase 1, in place: afterwards chunk (rank + 1) mod n holds the sum over all ranks."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    # BEGIN SOLUTION lab0: ring_reduce_scatter (hint: "ring chunks and phases" in the notebook)
    for step in range(n - 1):
        send_index, receive_index = (rank - step) % n, (rank - step - 1) % n
        received = torch.empty_like(chunks[receive_index])
        _exchange(chunks[send_index], received, group)
        chunks[receive_index] += received
    # END SOLUTION


def ring_all_gather(chunks: list[torch.Tensor], group=None) -> None:
    """Phase 2, in place: starting with chunk (rank + 1) mod n complete, make every chunk complete."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    # BEGIN SOLUTION lab0: ring_all_gather (hint: "ring chunks and phases" in the notebook)
    for step in range(n - 1):
        send_index, receive_index = (rank + 1 - step) % n, (rank - step) % n
        _exchange(chunks[send_index], chunks[receive_index], group)
    # END SOLUTION


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as one contiguous dimension (send and receive need one): a view when it is
    contiguous, else a copy."""
    return tensor.contiguous().view(-1)


def _written_back(flat: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` holding ``flat``'s values (copied back when ``flat`` is not its view)."""
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over the group, in place, with the two ring phases; returns it."""
    flat = _flat(tensor)
    chunks = ring_chunks(flat, dist.get_world_size(group))
    ring_reduce_scatter(chunks, group)
    ring_all_gather(chunks, group)
    return _written_back(flat, tensor)


def recursive_doubling_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over a group of a power-of-two size, in place, by recursive doubling;
    returns it."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n & (n - 1):
        raise ValueError(f"recursive doubling needs a power-of-two group, got {n} ranks: pair "
                         "the ranks of a group of another size with the ring instead")
    flat = _flat(tensor)
    # BEGIN SOLUTION lab0: recursive_doubling_all_reduce (hint: "recursive doubling steps" in the notebook)
    distance = 1
    while distance < n:
        received = torch.empty_like(flat)
        partner = rank ^ distance
        _swap(flat, received, partner, partner, group)
        flat += received
        distance *= 2
    # END SOLUTION
    return _written_back(flat, tensor)
