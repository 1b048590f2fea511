"""Every data-parallel kind by name: adding one is a module beside these and a line here."""
from __future__ import annotations

from reference_impl.hybrid.dp_kinds.bucketed_sync import BucketedSync
from reference_impl.hybrid.dp_kinds.fully_sharded import FullyShardedFSDP2
from reference_impl.hybrid.dp_kinds.hooked_ddp import HookedDDP
from reference_impl.hybrid.dp_kinds.kind import DataParallelKind
from reference_impl.hybrid.dp_kinds.zero_stages import ZeroStage

KINDS: dict[str, DataParallelKind] = {kind.name: kind for kind in (
    BucketedSync(), HookedDDP(), ZeroStage(1), ZeroStage(2), ZeroStage(3),
    FullyShardedFSDP2(),
)}
DP_KINDS = tuple(KINDS)


def kind_of(name: str) -> DataParallelKind:
    if name not in KINDS:
        raise ValueError(f"dp_kind must be one of {', '.join(KINDS)}, got {name!r}")
    return KINDS[name]
