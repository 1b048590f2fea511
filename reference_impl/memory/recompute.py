"""Activation recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", sections 4.1-5): full (each block's forward again in the backward) or
selective (only the attention core, whose saved tensors grow with s^2).

:func:`recompute` switches either on, in place, for every transformer block inside a module,
parameter names unchanged. What each mode saves and costs: docs/library.md, 'Activation memory,
term by term'.
"""
from __future__ import annotations

from torch import nn
from torch.utils.checkpoint import checkpoint

from reference_impl.model import (
    Block,
    CausalSelfAttention,
    attention_core,
    merge_heads,
    split_heads,
)

MODES = (None, "selective", "full")


# ------------------------------------------------------------------------ recomputing

class _FullRecompute:
    """Mixed in before a block's class: its forward runs under a non-reentrant checkpoint, so
    only its inputs are saved and the forward is run again in the backward."""

    def forward(self, *args, **kwargs):
        return checkpoint(self._recompute_base.forward, self, *args, use_reentrant=False,
                          **kwargs)


class _SelectiveRecompute:
    """Mixed in before an attention module's class: ``CausalSelfAttention.forward`` with the
    attention core (``attention_core``: explicit, or PyTorch's fused kernel) under a checkpoint
    (the paper's selective recomputation: its s^2 scores and softmax are not kept, but
    computed again)."""

    def forward(self, x):
        q, k, v = split_heads(self.qkv(x), self.heads)
        core = checkpoint(attention_core, q, k, v, self.attention, use_reentrant=False)
        return self.proj(merge_heads(core))


_MIXINS = {"full": _FullRecompute, "selective": _SelectiveRecompute}
_CLASSES: dict[tuple[type, str], type] = {}


def _recomputing_class(base: type, mode: str) -> type:
    """``base`` with the mode's forward (one class per (base, mode), as torch's parametrize
    does), so a module keeps its parameters, names and isinstance checks."""
    if (base, mode) not in _CLASSES:
        name = f"{'Full' if mode == 'full' else 'Selective'}Recompute{base.__name__}"
        _CLASSES[base, mode] = type(name, (_MIXINS[mode], base),
                                    {"_recompute_base": base, "_recompute_mode": mode})
    return _CLASSES[base, mode]


def _restore(module: nn.Module) -> None:
    base = getattr(type(module), "_recompute_base", None)
    if base is not None:
        module.__class__ = base


def _computes_causal_self_attention(cls: type) -> bool:
    """Whether ``cls.forward`` is ``CausalSelfAttention``'s computation (qkv, the attention core
    on ``self.heads`` heads, proj), which the selective mode re-implements: the class's own, or
    a subclass that says so (TP attention: the same steps on this rank's heads)."""
    return (cls.forward is CausalSelfAttention.forward
            or getattr(cls, "forward_is_causal_self_attention", False))


def recompute(module: nn.Module, mode: str | None) -> nn.Module:
    """Switch activation recomputation to ``mode`` for every transformer block in ``module``
    (``module`` itself if it is one), in place; returns ``module``.

    ``"full"``: each ``model.Block`` (or subclass: ``ParallelBlock``, ``SequenceParallelBlock``)
    keeps only its input. ``"selective"``: each ``CausalSelfAttention`` (or subclass) recomputes
    its attention core. ``None``: back to no recomputation. Applied per block, as Megatron-LM
    does, so a pipeline stage or a whole ``GPT`` keeps one input per block.
    """
    if mode not in MODES:
        raise ValueError(f"recompute mode must be one of {MODES}, got {mode!r}")
    for sub in module.modules():
        _restore(sub)
    target = {"full": Block, "selective": CausalSelfAttention}.get(mode)
    if target is None:
        return module
    found = False
    for sub in module.modules():
        if isinstance(sub, target):
            if mode == "selective" and not _computes_causal_self_attention(type(sub)):
                raise TypeError(f"selective recomputation re-implements CausalSelfAttention's "
                                f"forward; {type(sub).__name__} overrides it")
            sub.__class__ = _recomputing_class(type(sub), mode)
            found = True
    if not found:
        raise ValueError(f"no {target.__name__} in {type(module).__name__}: nothing to recompute")
    return module
