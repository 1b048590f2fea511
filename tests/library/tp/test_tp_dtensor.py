"""Cross-check the course's Megatron TP layers with PyTorch's own tensor parallelism (DTensor).

PyTorch's TP tests work this way: deep-copy a single-device module, ``parallelize_module`` it
on a ``DeviceMesh`` (fc1 ``ColwiseParallel``, fc2 ``RowwiseParallel``; likewise qkv and proj
in attention), run it and the single-device module on the same input and upstream gradient,
and compare. Here the DTensor module is compared with *both* the single-device module and
the reference ``ParallelMLP`` / ``ParallelSelfAttention`` built from the same weights: the
output, the input's gradient, every parameter's gradient (a DTensor gradient gathered with
``.full_tensor()``, ours with ``full_state``) and every weight after one SGD step. A last
test checks the whole TP block as ``benchmarks/tp_block.py`` times it (both use
``tp_dtensor.py``): DTensor's output and input gradient match ours, and both run the same
collectives (2 all-reduces of b*s*h*4 bytes forward, 2 backward: DTensor's counted with
``CommDebugMode``, ours with ``CommTracer``).

Tolerances (fp32): DTensor against the reference TP layers, atol 1e-6 and rtol 1e-6 (both run
the same local matmuls on the same shards and sum the same partials; observed: at most
6e-8 apart); either against the single-device module, atol 1e-5 (the partial sums add in
another order; observed: under 1e-6, for values up to about 10).

Not graded (no lab marker): this checks the reference implementation only.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from reference_impl.checks import assert_close
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.model import Block, CausalSelfAttention, MLP, ModelConfig
from reference_impl.tp.tp_attention import ParallelBlock, ParallelSelfAttention
from reference_impl.tp.tp_dtensor import dtensor_attention, dtensor_block, dtensor_mlp, qkv_rows_by_rank
from reference_impl.tp.tp_layers import ParallelMLP, full_state

ATOL_VS_REFERENCE_TP, RTOL_VS_REFERENCE_TP = 1e-6, 1e-6
ATOL_VS_SINGLE_DEVICE = 1e-5
HIDDEN, HEADS, SEQ, BATCH = 32, 4, 8, 2


def tp_mesh():
    """A 1-D mesh over every rank, on this rank's device type ("cpu" under gloo)."""
    return init_device_mesh(current_device().type, (dist.get_world_size(),))


# The DTensor attention (``dtensor_attention``, shared with the benchmark, which times the same
# module) permutes the fused qkv rows so that DTensor's plain contiguous ``ColwiseParallel``
# split gives rank r [q_r; k_r; v_r], its own heads' q, k and v (``qkv_rows_by_rank``), and
# sets ``heads`` to the local heads. Of the ways to give DTensor Megatron's head split this is
# the cleanest faithful one: a stock module under PyTorch's stock layer plan, computing the
# same function as the single-device module (checked below against it, unpermuted), the
# permutation undone only to compare the gathered qkv gradients and weights.


def unpermute_qkv(name: str, full: torch.Tensor, tp: int) -> torch.Tensor:
    """A full (gathered) tensor of the DTensor attention, back in the single-device row order."""
    if not name.startswith("qkv."):
        return full
    rows = qkv_rows_by_rank(full.shape[0] // 3, tp).to(full.device)
    original = torch.empty_like(full)
    original[rows] = full
    return original


def dtensor_full_state(module: nn.Module, grads: bool, tp: int) -> dict[str, torch.Tensor]:
    """Every parameter (or gradient) of a DTensor-parallelized module, full and unpermuted."""
    state = {}
    for name, parameter in module.named_parameters():
        value = parameter.grad if grads else parameter.detach()
        if isinstance(value, DTensor):
            value = value.full_tensor()  # collective over the mesh
        state[name] = unpermute_qkv(name, value, tp)
    return state


def three_way_triples(kind: str, seed: int = 0):
    """On every rank: single-device, reference TP and DTensor TP modules from the same weights,
    one forward, backward (same upstream gradient) and SGD step each; returns
    (what, dtensor, reference TP, single-device) tuples."""
    device, tp = current_device(), dist.get_world_size()
    torch.manual_seed(seed)  # the same weights and input on every rank
    if kind == "mlp":
        single = MLP(HIDDEN, 4 * HIDDEN).to(device)
        reference = ParallelMLP(single)
        dtensor = dtensor_mlp(single, tp_mesh())
    else:
        single = CausalSelfAttention(HIDDEN, HEADS).to(device)
        reference = ParallelSelfAttention(single)
        dtensor = dtensor_attention(single, tp_mesh())
    x = torch.randn(BATCH, SEQ, HIDDEN).to(device)
    upstream = torch.randn(BATCH, SEQ, HIDDEN).to(device)
    modules = {"dtensor": dtensor, "reference": reference, "single": single}
    outputs, inputs = {}, {}
    for name, module in modules.items():
        inputs[name] = x.clone().requires_grad_()
        outputs[name] = module(inputs[name])
        outputs[name].backward(upstream)
    assert not isinstance(outputs["dtensor"], DTensor), "RowwiseParallel should return a tensor"
    triples = [("output", *(outputs[n] for n in modules)),
               ("input grad", *(inputs[n].grad for n in modules))]

    def states(grads: bool):
        single_state = {n: (p.grad if grads else p.detach()) for n, p in single.named_parameters()}
        return (dtensor_full_state(dtensor, grads, tp), full_state(reference, grads=grads),
                single_state)

    dtensor_grads, reference_grads, single_grads = states(grads=True)
    triples += [(f"grad of {n}", dtensor_grads[n], reference_grads[n], single_grads[n])
                for n in single_grads]
    for module in modules.values():
        torch.optim.SGD(module.parameters(), lr=0.1).step()
    dtensor_weights, reference_weights, single_weights = states(grads=False)
    triples += [(f"{n} after a step", dtensor_weights[n], reference_weights[n], single_weights[n])
                for n in single_weights]
    return [(what, *(t.detach().cpu().clone() for t in values)) for what, *values in triples]


def assert_dtensor_matches_reference_tp(dtensor, reference, what: str, rank: int) -> None:
    assert_close(dtensor, reference, f"DTensor TP {what}", rank=rank, atol=ATOL_VS_REFERENCE_TP,
                 rtol=RTOL_VS_REFERENCE_TP, against="the reference TP",
                 likely_cause="they shard or reduce differently")


def assert_three_way(results):
    for rank, triples in enumerate(results):
        for what, dtensor, reference, single in triples:
            assert_dtensor_matches_reference_tp(dtensor, reference, what, rank)
            for name, value in (("DTensor TP", dtensor), ("reference TP", reference)):
                assert_close(value, single, f"{name} {what} vs single-device", rank=rank,
                             atol=ATOL_VS_SINGLE_DEVICE, rtol=0.0)


@pytest.mark.parametrize("tp", [2, 4])
def test_dtensor_mlp_matches_reference_parallel_mlp(run_on_ranks, tp):
    assert_three_way(run_on_ranks(three_way_triples, tp, "mlp"))


@pytest.mark.parametrize("tp", [2, 4])
def test_dtensor_attention_matches_reference_parallel_attention(run_on_ranks, tp):
    assert_three_way(run_on_ranks(three_way_triples, tp, "attention"))


def test_qkv_permutation_gives_each_rank_its_heads_q_k_v():
    hidden, tp = 8, 2  # rows: q 0..7, k 8..15, v 16..23; rank 0's heads are rows 0..3 of each
    assert qkv_rows_by_rank(hidden, tp).tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19,
                                                     4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]


def block_collectives_and_outputs():
    """One forward and backward of the TP block, DTensor's (as the benchmark builds it) and
    ours: the collectives each ran, and their outputs and input gradients."""
    device = current_device()
    torch.manual_seed(0)
    block = Block(ModelConfig(hidden=HIDDEN, heads=HEADS, seq_len=SEQ)).to(device)
    modules = {"reference": ParallelBlock(block), "dtensor": dtensor_block(block, tp_mesh())}
    x = torch.randn(BATCH, SEQ, HIDDEN).to(device)
    upstream = torch.randn(BATCH, SEQ, HIDDEN).to(device)
    result = {}
    for name, module in modules.items():
        tracer = CommTracer if name == "reference" else CommDebugMode
        x_in = x.clone().requires_grad_()
        with tracer() as forward:
            y = module(x_in)
        with tracer() as backward:
            y.backward(upstream)
        if name == "reference":
            comms = [(t.summary(), t.total_bytes("all_reduce")) for t in (forward, backward)]
        else:
            comms = [{str(op).split(".")[-1]: n for op, n in t.get_comm_counts().items()}
                     for t in (forward, backward)]
        result[name] = (comms, y.detach().cpu().clone(), x_in.grad.cpu())
    return result


def test_dtensor_block_matches_the_reference_and_runs_the_same_all_reduces(run_on_ranks):
    activation_bytes = BATCH * SEQ * HIDDEN * 4  # fp32: b * s * h * 4 bytes
    for rank, result in enumerate(run_on_ranks(block_collectives_and_outputs, 2)):
        (reference_comms, *reference) = result["reference"]
        (dtensor_comms, *dtensor) = result["dtensor"]
        for what, ours, theirs in zip(("block output", "block input grad"), reference, dtensor):
            assert_dtensor_matches_reference_tp(theirs, ours, what, rank)
        for direction, (summary, nbytes), counts in zip(("forward", "backward"),
                                                        reference_comms, dtensor_comms):
            assert summary == {"all_reduce": 2} and nbytes == 2 * activation_bytes, (
                f"rank {rank}: the reference TP block's {direction} ran {summary} of {nbytes} "
                f"bytes; expected 2 all-reduces of b*s*h*4 = {activation_bytes} bytes")
            assert counts == {"all_reduce": 2}, (
                f"rank {rank}: the DTensor TP block's {direction} ran {counts}; expected the "
                "same 2 all-reduces as the reference")
