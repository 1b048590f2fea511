"""The all-to-all that moves tokens between the ranks of an EP group, with its backward, and a
record of what each call sent.

``dist.all_to_all_single`` with uneven split sizes (Python ints, known on both sides once the
counts are exchanged, ``expert_parallel.py``) has no gradient; the lab's exercise
:class:`_AllToAll` gives it one, derived from the forward seen as one permutation of the rows of
the whole group: lab 9's notebook, "5. The all-to-all's backward". Backends and torch's own
autograd all-to-alls: ``docs/library.md``, "Beyond the three dimensions" (expert parallelism).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class AllToAllCall:
    """One all-to-all as it ran on this rank: rows sent to, and received from, each rank of the
    group; the bytes of one row."""

    name: str                      # e.g. "dispatch forward", "combine backward"
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    group_rank: int                # this rank's index in the group
    row_bytes: int

    @property
    def bytes_leaving(self) -> int:
        """The bytes this rank sent to other ranks (its own rows stay on the rank)."""
        rows = sum(self.send_splits) - self.send_splits[self.group_rank]
        return rows * self.row_bytes


def _exchange(rows: torch.Tensor, send_splits: list[int], recv_splits: list[int], group,
              name: str, log: list | None) -> torch.Tensor:
    """One ``dist.all_to_all_single`` of whole rows with uneven splits (the semantics of the
    module docstring), recorded in ``log`` as ``name``."""
    # BEGIN SOLUTION lab9: _exchange (hint: "the exchange and its backward" in the notebook)
    rows = rows.contiguous()
    received = rows.new_empty((sum(recv_splits), *rows.shape[1:]))
    dist.all_to_all_single(received, rows, output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)
    # END SOLUTION
    if log is not None:
        row_bytes = math.prod(rows.shape[1:]) * rows.element_size()
        log.append(AllToAllCall(name, tuple(send_splits), tuple(recv_splits),
                                dist.get_rank(group), row_bytes))
    return received


class _AllToAll(torch.autograd.Function):
    """The exchange of :func:`_exchange` with its backward; the arguments after ``rows`` are
    not differentiable. Both directions are logged, as ``"<name> forward"`` and
    ``"<name> backward"``."""

    @staticmethod
    def forward(ctx, rows, send_splits, recv_splits, group, name, log):
        # BEGIN SOLUTION lab9: _AllToAll.forward (hint: "the exchange and its backward" in the notebook)
        ctx.send_splits, ctx.recv_splits = send_splits, recv_splits
        ctx.group, ctx.name, ctx.log = group, name, log
        return _exchange(rows, send_splits, recv_splits, group, f"{name} forward", log)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION lab9: _AllToAll.backward (hint: "the exchange and its backward" in the notebook)
        # What was received goes back to where it came from; what was sent comes home.
        grad_rows = _exchange(grad, ctx.recv_splits, ctx.send_splits, ctx.group,
                              f"{ctx.name} backward", ctx.log)
        return grad_rows, None, None, None, None, None
        # END SOLUTION


def all_to_all_rows(rows: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                    group=None, name: str = "all-to-all", log: list | None = None) -> torch.Tensor:
    """Send ``send_splits[d]`` consecutive rows of ``rows`` to rank d of ``group``; return the
    ``recv_splits[s]`` rows from each rank s, in rank order. Differentiable
    (:class:`_AllToAll`). Each call, forward and backward, is appended to ``log`` as an
    :class:`AllToAllCall`. Collective over the group."""
    return _AllToAll.apply(rows, [int(n) for n in send_splits], [int(n) for n in recv_splits],
                           group, name, log)
