"""Activation memory: what autograd keeps for the backward, measured, and its formulas.

:class:`SavedActivations` measures the bytes autograd saves (saved-tensor hooks);
:func:`model_activation_bytes` is this model's exact count, per block and rank, with or without
recomputation (``recompute.py``), fp32 or bf16, explicit or sdpa attention, and
:func:`gpt_activation_bytes` the whole GPT's; Korthikanti et al. 2022, Table 2, is lab 7's
``perf.capacity.activation_bytes_per_layer``. The count term by term, against the paper's:
docs/library.md, 'Activation memory, term by term'.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from reference_impl.memory.recompute import MODES
from reference_impl.model import ModelConfig, check_attention
from reference_impl.model.precision import COMPUTE_DTYPES, check_precision

FP32 = 4  # bytes per element of the fp32 activations (and of bf16 runs' residual stream)
INDEX = 8  # bytes per token index (int64) that an embedding or the loss keeps


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded parameter's (DTensor's, under FSDP2) local tensor; a tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class SavedActivations:
    """Context manager: the bytes autograd saves for the backward while it is open.

    Saved-tensor hooks see every tensor an op keeps for its backward (also the inputs that a
    non-reentrant checkpoint keeps). Each storage is counted once (a view saves no new memory),
    and the storages of ``exclude`` (the parameters: they live anyway) are not counted::

        with SavedActivations(block.parameters()) as saved:
            y = block(x)
        saved.total  # bytes

    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.exclude = {_local(tensor).untyped_storage().data_ptr() for tensor in exclude}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def saved_activation_bytes(module: nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes saved for the backward by one forward of ``module`` on ``inputs``, parameters
    excluded. The forward's graph is dropped afterwards (no backward is run)."""
    with SavedActivations(module.parameters()) as saved:
        module(*inputs)
    return saved.total


# -------------------------------------------------------------------------- the formulas

def _element_bytes(precision: str) -> int:
    """Bytes of one element a matmul saves: 4 in fp32, 2 in bf16."""
    return torch.finfo(COMPUTE_DTYPES[check_precision(precision)]).bits // 8


def model_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1,
                           sequence_parallel: bool = False, recompute: str | None = None,
                           attention: str = "explicit", precision: str = "fp32") -> int:
    """Exact bytes saved for the backward by one block of *this* model (``model.Block``, no
    dropout) on one rank of a TP group of size t, with the ``attention`` kernel in
    ``precision``; the derivation is in docs/library.md. s, b, h, a: sequence,
    micro-batch, hidden, heads (global, not per rank)."""
    if recompute not in MODES:
        raise ValueError(f"recompute must be one of {MODES}, got {recompute!r}")
    if h % t or a % t or (sequence_parallel and s % t):
        raise ValueError(f"t = {t} must divide h = {h}, a = {a} (and s = {s} with SP)")
    e, sbh = _element_bytes(precision), s * b * h
    if recompute == "full":  # the block input: the residual stream, fp32 in either precision
        return FP32 * (sbh // t if sequence_parallel else sbh)
    # the layernorms keep their (fp32) inputs, the linears after them their outputs in e bytes
    if sequence_parallel:  # ln inputs t-split; the linears keep the gathered ln outputs
        replicated, layernorm_stats = FP32 * 2 * sbh // t + e * 2 * sbh, 16 * s * b // t
    else:
        replicated, layernorm_stats = FP32 * 2 * sbh + e * 2 * sbh, 16 * s * b
    total = replicated + e * 12 * sbh // t + layernorm_stats
    if recompute is None and check_attention(attention) == "explicit":
        softmax = FP32 + (e if e != FP32 else 0)  # fp32 softmax (+ its bf16 copy for @ v)
        total += softmax * a * s * s * b // t + s * s  # softmax output(s), bool causal mask
    elif recompute is None:  # sdpa: one fp32 log-sum-exp per row and head
        total += FP32 * a * s * b // t
    return total


def gpt_activation_bytes(config: ModelConfig, batch: int, precision: str = "fp32") -> int:
    """Exact bytes saved for the backward by one forward and loss of ``model.GPT(config)`` on
    ``batch`` sequences (one device, no recomputation): ``layers`` blocks
    (:func:`model_activation_bytes`) and the rest, with the tokens and the targets as separate
    int64 tensors: the token and position indices (8 bs + 8 s), the final layernorm's input and
    statistics (4 bsh + 8 bs), the head's input (e bsh), cross-entropy's fp32 log-softmax
    (4 bsV), its targets (8 bs) and its 4-byte total weight."""
    s, b, h = config.seq_len, batch, config.hidden
    blocks = config.layers * model_activation_bytes(s, b, h, config.heads,
                                                    attention=config.attention,
                                                    precision=precision)
    rest = (INDEX * b * s + INDEX * s + FP32 * b * s * h + 2 * FP32 * b * s
            + _element_bytes(precision) * b * s * h + FP32 * b * s * config.vocab_size
            + INDEX * b * s + FP32)
    return blocks + rest
