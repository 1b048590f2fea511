"""Record every collective and point-to-point call: which op, over how many ranks, how many bytes.

    with CommTracer() as trace:
        loss = model(x).sum(); loss.backward()
    trace.count("all_reduce"), trace.total_bytes("all_reduce")

While active, the tracer wraps the ``torch.distributed`` functions below, on this rank, and
records each call before passing it on. ``nbytes`` is the payload: the tensor an all-reduce or
broadcast operates on, the *whole* gathered output of an all-gather, the *whole* input of a
reduce-scatter or of an all-to-all (the rows a rank keeps for itself included: what leaves it
is the input less its own split), the message of a send or receive. (What a ring then moves
per rank follows from the payload S: 2(n-1)/n * S for an all-reduce, (n-1)/n * S for an
all-gather or a reduce-scatter; see ``alpha_beta.py``.)
"""
from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as distributed_c10d


@dataclass(frozen=True)
class CommCall:
    op: str
    group_size: int
    nbytes: int
    ranks: tuple[int, ...] = ()  # the group's global ranks, in the group's order
    peer: int | None = None      # a send's destination or a receive's source (global rank)

    def as_data(self) -> dict:
        """The call as plain data (what a rank may return to a graded test)."""
        return {"op": self.op, "ranks": list(self.ranks), "nbytes": self.nbytes,
                "peer": self.peer}


_PEER_ARGUMENT = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}


def _group_ranks(group) -> tuple[int, ...]:
    return tuple(dist.get_process_group_ranks(group or dist.group.WORLD))


def _peer(op: str, bound: dict) -> int | None:
    """A send's destination or a receive's source, as a global rank (None for collectives)."""
    if op not in _PEER_ARGUMENT:
        return None
    peer = bound.get(_PEER_ARGUMENT[op])
    if peer is None and bound.get(f"group_{_PEER_ARGUMENT[op]}") is not None:
        peer = dist.get_global_rank(bound["group"], bound[f"group_{_PEER_ARGUMENT[op]}"])
    return None if peer is None else int(peer)


def _size(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(_size(t) for t in tensors)


# op -> which argument holds the payload (0: first positional, 1: second)
_PAYLOAD_ARGUMENT = {
    "all_reduce": 0, "broadcast": 0, "send": 0, "recv": 0, "isend": 0, "irecv": 0,
    "all_gather": 0,                 # the list of gathered outputs
    "all_gather_into_tensor": 0,     # the gathered output tensor
    "reduce_scatter": 1,             # the list of inputs
    "reduce_scatter_tensor": 1,      # the whole input tensor
    "all_to_all": 1,                 # the list of inputs, one per rank (own included)
    "all_to_all_single": 1,          # the whole input tensor (own rows included)
}


class CommTracer:
    """A context manager recording every traced ``torch.distributed`` call on this rank.

    ``peers``: the global ranks a point-to-point call may name (this rank's group); a peer
    outside them is refused at once, where the call would otherwise wait for a rank that never
    answers."""

    def __init__(self, peers=None):
        self.calls: list[CommCall] = []
        self.peers = None if peers is None else sorted(peers)
        self._originals = {}

    def _check_peer(self, op: str, peer: int | None) -> None:
        if self.peers is None or peer is None or peer in self.peers:
            return
        raise ValueError(
            f"rank {dist.get_rank()}: {op} {'to' if 'send' in op else 'from'} global rank "
            f"{peer}, outside its group {self.peers}. Likely cause: a peer given as a rank in "
            "the group where the call takes a global rank (the group left out of the call, or "
            "not translated with dist.get_global_rank)")

    def __enter__(self) -> "CommTracer":
        for op, argument in _PAYLOAD_ARGUMENT.items():
            original = getattr(dist, op)
            self._originals[op] = original
            setattr(dist, op, self._wrap(op, argument, original))
        self._originals["batch_isend_irecv"] = dist.batch_isend_irecv
        dist.batch_isend_irecv = self._wrap_batch(dist.batch_isend_irecv)
        self._originals["P2POp"] = dist.P2POp
        dist.P2POp = self._untracing_p2p_op(dist.P2POp)
        return self

    def __exit__(self, *exc_info) -> None:
        for op, original in self._originals.items():
            setattr(dist, op, original)
        self._originals.clear()

    def _wrap(self, op, argument, original):
        parameters = list(inspect.signature(original).parameters)

        def traced(*args, **kwargs):
            bound = dict(zip(parameters, args)) | kwargs  # however the caller passed them
            group = bound.get("group")
            payload = bound[parameters[argument]]
            self._check_peer(op, _peer(op, bound))
            self.calls.append(CommCall(op, dist.get_world_size(group), _size(payload),
                                       _group_ranks(group), _peer(op, bound)))
            return original(*args, **kwargs)
        traced.untraced = original
        return traced

    @staticmethod
    def _untracing_p2p_op(original):
        """``dist.P2POp`` accepting the traced ``dist.isend`` / ``dist.irecv`` (it checks its
        op against the originals): the operation keeps the original, and
        :meth:`_wrap_batch` records it when it is posted."""
        class P2POp(original):
            def __new__(cls, op, *args, **kwargs):
                return original.__new__(cls, getattr(op, "untraced", op), *args, **kwargs)

            def __init__(self, op, *args, **kwargs):
                super().__init__(getattr(op, "untraced", op), *args, **kwargs)
        return P2POp

    def _wrap_batch(self, original):
        """Point-to-point operations posted together (``batch_isend_irecv``, as the pipeline
        executor does): each is recorded as the isend or irecv it is."""
        def traced(operations):
            for operation in operations:
                op = "isend" if operation.op is distributed_c10d.isend else "irecv"
                self._check_peer(op, operation.peer)
                self.calls.append(CommCall(op, dist.get_world_size(operation.group),
                                           _size(operation.tensor),
                                           _group_ranks(operation.group), operation.peer))
            return original(operations)
        return traced

    def count(self, op: str | None = None) -> int:
        return sum(1 for call in self.calls if op is None or call.op == op)

    def total_bytes(self, op: str | None = None) -> int:
        return sum(call.nbytes for call in self.calls if op is None or call.op == op)

    def summary(self) -> dict[str, int]:
        """How many calls of each op."""
        return dict(Counter(call.op for call in self.calls))
