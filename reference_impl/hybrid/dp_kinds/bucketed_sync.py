"""``sync``: after the backward, a bucketed all-reduce of every gradient over the replicas
(``data_parallel.sync_gradients``), Megatron's convention by default."""
from __future__ import annotations

from reference_impl.hybrid.data_parallel import sync_gradients
from reference_impl.hybrid.dp_kinds.kind import DataParallelKind


class BucketedSync(DataParallelKind):
    name = "sync"

    def reduce(self, model, convention: str):
        return sync_gradients(list(model.stages.values()), model.gradient_groups, convention,
                              model.bucket_bytes)
