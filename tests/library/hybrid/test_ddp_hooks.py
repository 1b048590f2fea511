"""Data parallelism from backward hooks (reference_impl/hybrid/ddp_hooks.py) against one device.

Two CPU ranks, each on its own half of the batch; the oracle is the single-device model on the
whole batch (the mean loss over all samples). Checked, for buckets of one parameter each, of a
few parameters and of everything: every rank's output on its samples, every parameter's
gradient after ``finish_gradient_sync``, the weights after an SGD step, and the number of
all-reduces (one per bucket, all launched from the hooks, none inside ``no_sync``); then two
micro-batches accumulated under ``no_sync`` against the single-device gradient of both.

Tolerance (fp32): 1e-6 absolute and relative (only the order of the sums changes).
"""
import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from reference_impl.checks import assert_close
from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.hybrid.ddp_hooks import OverlappingDataParallel

WORLD, SAMPLES, LR = 2, 4, 0.1
BUCKETS = {"one per parameter": 0, "a few parameters": 600, "everything": 2**20}
TOLERANCE = dict(atol=1e-6, rtol=1e-6)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 4))


def batch(micro: int, rank: int):
    generator = torch.Generator().manual_seed(100 * micro + rank)
    return torch.randn(SAMPLES, 8, generator=generator), torch.randn(SAMPLES, 4,
                                                                       generator=generator)


def single_device(micro_batches: int):
    """The whole batch (every rank's samples) on one device: outputs per rank of the first
    micro-batch, the gradients of the mean loss (summed over micro-batches, each scaled by
    1 / micro_batches), and the weights after one SGD step."""
    reference = model()
    outputs = []
    for micro in range(micro_batches):
        xs, ys = zip(*(batch(micro, rank) for rank in range(WORLD)))
        output = reference(torch.cat(xs))
        outputs.append(list(output.detach().chunk(WORLD)))
        (F.mse_loss(output, torch.cat(ys)) / micro_batches).backward()
    grads = {name: p.grad.clone() for name, p in reference.named_parameters()}
    torch.optim.SGD(reference.parameters(), lr=LR).step()
    return outputs[0], grads, {name: p.detach().clone() for name, p in reference.named_parameters()}


@contextlib.contextmanager
def counting_all_reduces(log: list):
    """While open, every dist.all_reduce appends the phase the test is in (``phase[0]``) to
    ``log``."""
    original, phase = dist.all_reduce, ["outside"]

    def counted(*args, **kwargs):
        log.append(phase[0])
        return original(*args, **kwargs)

    dist.all_reduce = counted
    try:
        yield phase
    finally:
        dist.all_reduce = original


def train_on_rank(bucket_bytes: int, micro_batches: int):
    log = []
    with counting_all_reduces(log) as phase:
        return train(bucket_bytes, micro_batches, phase) + (log,)


def train(bucket_bytes: int, micro_batches: int, phase: list):
    device, rank = current_device(), dist.get_rank()
    ddp = OverlappingDataParallel(model().to(device), bucket_bytes=bucket_bytes)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    outputs = []
    for micro in range(micro_batches):
        x, y = (t.to(device) for t in batch(micro, rank))
        last = micro == micro_batches - 1
        with contextlib.nullcontext() if last else ddp.no_sync():
            output = ddp(x)
            phase[0] = "backward" if last else "no_sync"
            (F.mse_loss(output, y) / micro_batches).backward()
            phase[0] = "after"
        outputs.append(output.detach().cpu())
    ddp.finish_gradient_sync()
    grads = {name: p.grad.cpu().clone() for name, p in ddp.module.named_parameters()}
    optimizer.step()
    weights = {name: p.detach().cpu().clone() for name, p in ddp.module.named_parameters()}
    return outputs[0], grads, weights, len(ddp.buckets)


@pytest.fixture(scope="module")
def runs():
    """Every configuration in one launch (2 ranks): bucket sizes x (1 or 2 micro-batches)."""
    def all_configurations():
        return {(name, micro): train_on_rank(bucket_bytes, micro)
                for name, bucket_bytes in BUCKETS.items() for micro in (1, 2)}
    return launch(all_configurations, WORLD, backend="gloo", timeout=120)


@pytest.mark.parametrize("micro_batches", [1, 2], ids=["one batch", "accumulated under no_sync"])
@pytest.mark.parametrize("buckets", BUCKETS)
def test_matches_the_single_device_model(runs, buckets, micro_batches):
    outputs, grads, weights = single_device(micro_batches)
    for rank, result in enumerate(runs):
        output, rank_grads, rank_weights, bucket_count, log = result[buckets, micro_batches]
        where = f"buckets: {buckets}, {micro_batches} micro-batch(es)"
        assert_close(output, outputs[rank], f"{where}: output", rank=rank, **TOLERANCE)
        for name in grads:
            assert_close(rank_grads[name], grads[name], f"{where}: {name} grad", rank=rank,
                         **TOLERANCE)
            assert_close(rank_weights[name], weights[name], f"{where}: {name} after SGD",
                         rank=rank, **TOLERANCE)
        assert log == ["backward"] * bucket_count, (
            f"rank {rank}, {where}: all-reduces by phase {log}; expected one per bucket "
            f"({bucket_count}), every one launched from a hook in the synced backward")


def test_bucket_counts_follow_the_size(runs):
    # reversed: 4.bias 16 B, 4.weight 256, 2.bias 64, 2.weight 1024, 0.bias 64, 0.weight 512;
    # at most 600 bytes: [336], [1024 alone], [576]
    counts = {name: runs[0][name, 1][3] for name in BUCKETS}
    assert counts == {"one per parameter": 6, "a few parameters": 3, "everything": 1}, counts


def bad_input():
    messages = []
    for bucket_bytes in (-1, 1.5):
        try:
            OverlappingDataParallel(model(), bucket_bytes=bucket_bytes)
        except ValueError as error:
            messages.append(str(error))
    ddp = OverlappingDataParallel(model())
    ddp(torch.randn(2, 8))[:, :1].sum().backward()  # every parameter gets a gradient
    ddp.finish_gradient_sync()
    ddp.zero_grad()
    frozen_input = torch.randn(2, 16)
    ddp.module[4](frozen_input).sum().backward()  # only the last layer gets gradients
    try:
        ddp.finish_gradient_sync()
    except RuntimeError as error:
        messages.append(str(error))
    return messages


def test_bad_input_is_refused_with_the_numbers():
    messages = launch(bad_input, 1, backend="gloo", timeout=60)[0]
    assert len(messages) == 3, messages
    assert "bucket_bytes must be an integer >= 0" in messages[0] and "-1" in messages[0]
    assert "1.5" in messages[1]
    assert "4 parameter(s) got no gradient" in messages[2] and "0.weight" in messages[2]
