"""SageMaker's distributed linear layer: tensor parallelism *over data-parallel ranks*.

After the SageMaker model parallelism library documentation, "How Tensor Parallelism Works":
every rank of the TP group holds its own data samples, as in data parallelism, but only 1/tp of
the linear layer y = x W^T + b, split by input columns. :class:`DistributedLinear` all-gathers
the group's samples along the batch, multiplies its columns of them by its shard (a partial
output for every sample), reduce-scatters (sum) the partial outputs so that each rank gets its
own samples' outputs, and adds the bias once. Backward, the two collectives are the
sequence-parallel pair of :mod:`tp_collectives` (``reduce_scatter_to_sp``, ``gather_from_sp``)
along the batch dimension, and ``copy_to_tp`` sums the bias's gradient over the group.

The derivation: lab 2's notebook, "6. SageMaker's distributed linear"; why the input columns and
how its gradients compare with data parallelism's: ``docs/library.md``, "Tensor parallelism".
"""
from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.tp.tp_collectives import copy_to_tp, gather_from_sp, reduce_scatter_to_sp
from reference_impl.tp.tp_layers import sharded_parameter
from reference_impl.tp.tp_splits import check_divisible

BATCH_DIM = 0


class DistributedLinear(nn.Module):
    """A data-parallel ``linear`` whose weight is split by input columns over the TP group.

    Rank r calls it on its own samples x_r (batch first; every rank the same batch size) and
    gets linear(x_r); the weight shard's and the bias's gradients are those of the whole
    group's summed loss."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        tp = dist.get_world_size(group)
        check_divisible(linear.in_features, tp, "input features")
        self.group = group
        # BEGIN SOLUTION lab2: DistributedLinear.__init__ (hint: "the distributed linear" in the notebook)
        self.columns = linear.in_features // tp  # this rank's slice of the input features
        self.weight = sharded_parameter(linear.weight, 1, group)  # W[:, cols_r]
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION lab2: DistributedLinear.forward (hint: "the distributed linear" in the notebook)
        first = dist.get_rank(self.group) * self.columns
        samples = gather_from_sp(x, BATCH_DIM, self.group)[..., first:first + self.columns]
        y = reduce_scatter_to_sp(F.linear(samples, self.weight), BATCH_DIM, self.group)
        return y + copy_to_tp(self.bias, self.group) if self.bias is not None else y
        # END SOLUTION
