"""What a rank writes into a sharded checkpoint and reads back, for
``torch.distributed.checkpoint`` (DCP): :class:`FlatPiece`, elements ``[start, stop)`` of one
row of a ``(rows, numel)`` tensor, and the planners that read and write through it.

DCP saves a tensor as chunks (an offset and a size per dimension) and, on load, reads each
rank's chunk from whichever saved chunks overlap it: so a checkpoint written by one layout
loads into another. A data-parallel shard of any kind (ZeRO's flat slices, FSDP2's row
blocks, a whole replica) is a run of its TP shard's flat elements: one chunk of a row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType


@dataclass(frozen=True)
class FlatPiece:
    """``flat`` is elements ``[start, start + len)`` of row ``row`` of a (rows, numel) tensor."""

    flat: torch.Tensor
    row: int
    rows: int
    start: int
    numel: int

    def size(self) -> torch.Size:
        return torch.Size([self.rows, self.numel])

    def _chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=torch.Size([self.row, self.start]),
                                    sizes=torch.Size([1, self.flat.numel()]))

    def __create_write_items__(self, fqn: str, _) -> list[WriteItem]:
        chunk = self._chunk()
        return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=chunk, size=self.size(),
                              properties=TensorProperties.create_from_tensor(self.flat)))]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self._chunk()]


def _lookup(state_dict: dict, index: MetadataIndex):
    piece = state_dict[index.fqn]
    return piece.flat.view(1, -1) if isinstance(piece, FlatPiece) else None


class PieceSavePlanner(DefaultSavePlanner):
    """DCP's planner, writing each :class:`FlatPiece` from this rank's tensor."""

    def __init__(self):
        super().__init__(flatten_state_dict=False)

    def lookup_object(self, index: MetadataIndex):
        found = _lookup(self.state_dict, index)
        return super().lookup_object(index) if found is None else found


class PieceLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, reading into each :class:`FlatPiece`'s tensor in place (the state dict
    is flat and already on its devices: nothing to set up)."""

    def __init__(self):
        super().__init__(flatten_state_dict=False)

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def lookup_tensor(self, index: MetadataIndex):
        found = _lookup(self.state_dict, index)
        return super().lookup_tensor(index) if found is None else found
