# Student file for the labs, generated from reference_impl/tp/sagemaker_linear.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""SageMaker's distributed linear layer: tensor parallelism *over data-parallel ranks*.

After the SageMaker model parallelism library documentation, "How Tensor Parallelism Works".

Every rank of the TP group holds its own data samples, as in data parallelism, but only 1/tp of
the linear layer y = x W^T + b. In the documentation's words: "each tp_rank collects the
relevant half of all data samples and passes it through their half of the nn.Linear module.
The result needs to be reduce-scattered (with summation as the reduction operation) so that each
rank has the final linear output for their own data samples."

Which half? The reduction is a *sum*, so each rank must compute a *partial* product: W is split
by **input columns**, rank r holding W_r = W[:, cols_r] (out x in/tp). Then, with X the
samples of the whole group stacked along the batch dimension,

    X        = all-gather of every rank's x_s along dim 0       (tp*batch, ..., in)
    P_r      = X[..., cols_r] W_r^T                             partial outputs, every sample
    y_r      = reduce-scatter (sum) of P over dim 0 = sum_s P_s[rank r's samples] = x_r W^T
    y_r     += b                                                once, after the sum

(Split by output rows instead, each rank would hold *complete* outputs of some features for
every sample, and giving each rank its samples back would be an all-to-all, with nothing to sum.
Taking the column slice after the all-gather keeps the documentation's all-gather; an
all-to-all of the slices would move 1/tp of the bytes.)

Backward, each collective has the conjugate of :mod:`tp_collectives`' sequence-parallel pair,
applied along the batch dimension instead of the sequence:

* the reduce-scatter's gradient is an **all-gather** (``reduce_scatter_to_sp``): every rank's
  partial P_r fed every rank's output, so every rank needs every rank's output gradient;
* the all-gather's gradient is a **reduce-scatter** (``gather_from_sp``), *not* "keep my slice"
  as in ``gather_from_tp``: the gathered X is used differently on each rank (through its own
  W_r), so each rank's gradient of X is only a part (its columns) of the true one, and sample
  block s's input gradient is the sum of every rank's part for that block.

What the gradients are, for the summed loss L = sum_r L_r(y_r) of the group's samples:

* W_r's gradient is dP^T X[..., cols_r] over *all* the group's samples: the full-batch gradient,
  i.e. what data parallelism gets after an all-reduce **sum** of the per-rank gradients.
* The bias is replicated and each rank adds it to its own samples only, so its local gradient
  would be its samples' part alone. ``copy_to_tp`` on the bias (identity forward, all-reduce
  backward) sums it over the group, so the bias's gradient is the full-batch gradient too and
  the whole layer needs no further gradient synchronisation within the TP group.

So the layer is equivalent to a replicated nn.Linear under data parallelism with the gradients
**summed** over the TP group (DDP's default *averages*: divide by tp, e.g. by scaling the loss).
In SageMaker's layout what is left of the data-parallel reduction for these parameters runs
over the *reduced* data-parallel group (RDP, as SageMaker's ranking page defines
it): the ranks holding the same shard in other TP groups.
"""
from __future__ import annotations

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tp_collectives import copy_to_tp, gather_from_sp, reduce_scatter_to_sp
from tp_layers import check_divisible, sharded_parameter

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
        raise NotImplementedError('lab2: DistributedLinear.__init__ (hint: "the distributed linear" in the notebook)')

    def forward(self, x):
        raise NotImplementedError('lab2: DistributedLinear.forward (hint: "the distributed linear" in the notebook)')
