# Student file for the labs, generated from reference_impl/hybrid/zero.py by
# `python -m reference_impl.course.make_labs`: fill in every
# `raise NotImplementedError`, then check with `pytest --impl labs -m labN`.
"""ZeRO: data parallelism that shards the model states over the data-parallel ranks.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (ApX Machine Learning's masterclass counts it among the hybrid strategies: a way to save
data parallelism's memory, not a parallelism dimension). Each of the N ranks keeps its 1/N
shard of the optimizer states (stage 1), of the gradients too, reduce-scattered during the
backward (stage 2), and of the parameters, gathered around each layer's forward and backward
(stage 3). Each parameter is flattened, zero-padded to a multiple of N and cut into N shards;
the step is ``torch.optim.Adam``'s (or AdamW's) math on the shards, so they end up exactly as
unsharded Adam leaves them. :func:`model_state_bytes` measures what a rank holds, against
``zero_memory_formula`` (``memory/model_states.py``).

Lab 5's notebook, "6. ZeRO: the memory of the model states" and "ZeRO's shards and step";
stage 3's hooks and the limits: ``docs/library.md``, "Hybrid and 3D parallelism".
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten

from reference_impl.memory.model_states import (  # noqa: F401 (the formulas: exported)
    BYTES_PER_PARAMETER, STAGES, zero_memory_formula)


def shard_size(numel: int, world_size: int) -> int:
    """Elements in each rank's shard of a parameter of ``numel`` elements: ceil(numel / N)."""
    return math.ceil(numel / world_size)


def padded_numel(module_or_numels, world_size: int) -> int:
    """Parameters counted after padding each one to a multiple of N (what ZeRO shards)."""
    numels = ([p.numel() for p in module_or_numels.parameters() if p.requires_grad]
              if isinstance(module_or_numels, nn.Module) else list(module_or_numels))
    return sum(shard_size(n, world_size) * world_size for n in numels)


def adam_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                exp_avg_sq: torch.Tensor, step: int, lr: float, betas: tuple[float, float],
                eps: float, weight_decay: float = 0.0,
                decoupled_weight_decay: bool = False) -> None:
    """One Adam step in place, the same operations as ``torch.optim.Adam`` (single-tensor path,
    no amsgrad): m <- lerp(m, g, 1-b1); v <- b2 v + (1-b2) g^2; p <- p - lr/(1-b1^t) *
    m / (sqrt(v)/sqrt(1-b2^t) + eps). Weight decay as torch: added to the gradient (L2), or
    with ``decoupled_weight_decay`` (``torch.optim.AdamW``; Loshchilov & Hutter 2019,
    "Decoupled Weight Decay Regularization") p <- p (1 - lr wd) first. Elementwise, so it can
    run on any shard."""
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    beta1, beta2 = betas
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step = float(step)  # torch keeps the step in a float tensor and reads it with .item()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


class _ShardedParameter:
    """One parameter's ZeRO bookkeeping on this rank: its shard's slice and its states."""

    def __init__(self, param: nn.Parameter, world_size: int, rank: int):
        self.param = param
        self.numel = param.numel()
        self.size = shard_size(self.numel, world_size)
        self.padded = self.size * world_size
        self.start = rank * self.size
        self.exp_avg = torch.zeros(self.size, dtype=param.dtype, device=param.device)
        self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        self.grad: torch.Tensor | None = None  # stages 2, 3: this rank's averaged gradient shard
        self.master: torch.Tensor | None = None  # stage 3: this rank's parameter shard
        self.owner: nn.Module | None = None  # stage 3: the module whose forward uses it
        self.step = 0

    def padded_flat(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (shaped as the parameter) flattened and zero-padded to N * shard size
        elements: what the collectives cut into N equal pieces."""
        raise NotImplementedError('lab5: padded_flat (hint: "shards, groups and ZeRO-2" in the notebook)')

    def my_slice(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's shard of ``tensor``: ``self.size`` elements of its padded flat form."""
        raise NotImplementedError('lab5: my_slice (hint: "shards, groups and ZeRO-2" in the notebook)')


HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay")


class ZeroOptimizer:
    """Adam with ZeRO stage 1, 2 or 3 over the data-parallel ``group`` (default: every rank).

        optimizer = ZeroOptimizer(model, group, stage=2, lr=1e-3)
        loss = model(x).sum(); loss.backward(); optimizer.step(); optimizer.zero_grad()

    Build it on every rank of ``group`` from the same module (the same initial weights);
    stages 2 and 3 install hooks on the module (``remove_hooks`` takes them off). Gradients are
    averaged over the group, as data parallelism does.

    ``param_groups`` (torch's format, e.g. a ``torch.optim.AdamW``'s ``param_groups``) give
    parameters their own :data:`HYPERPARAMETERS` (the keywords are the defaults; the module's
    other parameters form one more group); ``decoupled_weight_decay=True`` is AdamW. As with
    a torch optimizer, setting ``group["lr"]`` in :attr:`param_groups` changes the next steps'.
    """

    def __init__(self, module: nn.Module, group=None, stage: int = 1, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, decoupled_weight_decay: bool = False,
                 param_groups: list[dict] | None = None):
        if stage not in STAGES:
            raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
        if not dist.is_initialized():
            raise RuntimeError("ZeroOptimizer needs an initialised process group (run it inside "
                               "reference_impl.comm.launcher.launch or under torchrun)")
        self.module, self.group, self.stage = module, group, stage
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.shards: dict[nn.Parameter, _ShardedParameter] = {}
        for param in module.parameters():
            if param.requires_grad and param not in self.shards:
                self.shards[param] = _ShardedParameter(param, self.world_size, self.rank)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay)
        self.param_groups = _complete_groups(param_groups or [], list(self.shards), defaults)
        self._group_of = {param: g for g in self.param_groups for param in g["params"]}
        self._averaged = False  # stage 1: this step's gradients reduced already
        self._handles = []
        if stage >= 2:
            raise NotImplementedError('lab5: ZeroOptimizer.__init__ (hint: "shards, groups and ZeRO-2" in the notebook)')
        if stage == 3:
            self._owners = {}  # module -> its parameters (recurse=False) that ZeRO manages
            self._gathered = set()  # modules whose parameters are whole right now
            self._reduced = {}  # module -> how many of its gradients were reduced this backward
            for owner in module.modules():
                params = [p for p in owner.parameters(recurse=False) if p in self.shards]
                if not params:
                    continue
                self._owners[owner] = params
                for param in params:
                    self.shards[param].owner = owner
                    self.shards[param].master = self.shards[param].my_slice(param).clone()
                self._handles.append(owner.register_forward_pre_hook(self._pre_forward))
                self._handles.append(owner.register_forward_hook(self._post_forward))
                self._gathered.add(owner)
                self._free(owner)

    # ------------------------------------------------------------------ gradients (stages 2, 3)

    def _reduce_scatter(self, param: nn.Parameter) -> None:
        """Post-accumulate-grad hook: keep this rank's shard of the averaged gradient, drop the
        full one (stage 2 and 3); under stage 3, free the owner's parameters once all are done."""
        shard = self.shards[param]
        raise NotImplementedError('lab5: _reduce_scatter (hint: "shards, groups and ZeRO-2" in the notebook)')
        if self.stage == 3:
            owner = shard.owner
            self._reduced[owner] = self._reduced.get(owner, 0) + 1
            if self._reduced[owner] == len(self._owners[owner]):
                self._reduced[owner] = 0
                self._free(owner)

    # ------------------------------------------------------------------ parameters (stage 3)

    def _gather_full(self, shard: _ShardedParameter, piece: torch.Tensor) -> torch.Tensor:
        """The whole parameter, as a new tensor shaped as it, from every rank's ``piece`` of it
        (this rank's is ``piece``): an all-gather over the group."""
        raise NotImplementedError('lab5: _gather_full (hint: "shards, groups and ZeRO-2" in the notebook)')

    def _gather(self, owner: nn.Module) -> None:
        """Give ``owner``'s parameters their storage back and fill it from the shards."""
        if owner in self._gathered:
            return
        for param in self._owners[owner]:
            full = self._gather_full(self.shards[param], self.shards[param].master)
            param.untyped_storage().resize_(param.numel() * param.element_size())
            param.data.copy_(full)  # through .data: autograd's saved views see the new values
        self._gathered.add(owner)

    def _free(self, owner: nn.Module) -> None:
        """Release ``owner``'s full parameters: their storage shrinks to 0 bytes (the tensors,
        and autograd's saved views of them, keep their shape; ``_gather`` refills them)."""
        if owner not in self._gathered:
            return
        for param in self._owners[owner]:
            param.untyped_storage().resize_(0)
        self._gathered.discard(owner)

    def _pre_forward(self, owner, args):
        self._gather(owner)

    def _post_forward(self, owner, args, output):
        self._free(owner)
        if torch.is_grad_enabled():
            # The gradient of the output arrives just before the owner's backward runs.
            for tensor in tree_flatten(output)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(lambda grad, owner=owner: self._gather(owner))

    # --------------------------------------------------------------------------- the step

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Stage 1: average the whole gradients over the group and keep this rank's shard of
        the mean in ``shard.grad``, as stages 2 and 3 have it after the backward (nothing to
        do there). :meth:`step` calls it; call it before to read or scale the shards first
        (gradient clipping). Collective under stage 1."""
        if self.stage != 1 or self._averaged:
            return
        self._averaged = True
        for param, shard in self.shards.items():
            raise NotImplementedError('lab5: reduce_gradients (hint: "shards, groups and ZeRO-2" in the notebook)')

    def hyperparameters(self, param: nn.Parameter) -> dict:
        """The :data:`HYPERPARAMETERS` of ``param``'s group, as they are now (``adam_update``'s
        keywords)."""
        group = self._group_of[param]
        return {key: group[key] for key in HYPERPARAMETERS}

    @torch.no_grad()
    def step(self) -> None:
        """Average the gradients (stage 1), update this rank's shards with Adam, and (stages 1,
        2) all-gather the updated parameters. Collective: every rank of the group calls it."""
        self.reduce_gradients()
        for param, shard in self.shards.items():
            grad = shard.grad
            if grad is None:
                continue
            shard.step += 1
            weights = shard.master if self.stage == 3 else shard.my_slice(param).clone()
            raise NotImplementedError('lab5: ZeroOptimizer.step (hint: "shards, groups and ZeRO-2" in the notebook)')
            if self.stage == 1:
                shard.grad = None  # stage 1's shard lives for the step only
        self._averaged = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._averaged = False
        for param, shard in self.shards.items():
            if set_to_none:
                param.grad, shard.grad = None, None
            else:
                for grad in (param.grad, shard.grad):
                    if grad is not None:
                        grad.zero_()

    # --------------------------------------------------------------------------- inspection

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter whole (as this rank's module defines it: a TP module's local
        shard), by name. Collective under stage 3 (all-gathers); copies otherwise."""
        state = {}
        for name, param in self.module.named_parameters():
            if self.stage == 3 and param in self.shards:
                shard = self.shards[param]
                state[name] = self._gather_full(shard, shard.master).clone()
            else:
                state[name] = param.detach().clone()
        return state

    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The tensors the optimizer holds, by kind: parameter shards (stage 3), gradient
        shards (stages 2, 3), optimizer states (m and v of this rank's shard)."""
        shards = list(self.shards.values())
        return {
            "parameters": [s.master for s in shards if s.master is not None],
            "gradients": [s.grad for s in shards if s.grad is not None],
            "optimizer": [t for s in shards for t in (s.exp_avg, s.exp_avg_sq)],
        }

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _complete_groups(groups: list[dict], params: list[nn.Parameter], defaults: dict) -> list[dict]:
    """``groups`` with each missing hyperparameter taken from ``defaults``, plus one group of
    the ``params`` no group names; a parameter ZeRO does not manage, or named twice, is refused."""
    managed, named, complete = set(params), set(), []
    for group in groups:
        members = list(group["params"])
        if any(p not in managed or p in named for p in members):
            raise ValueError("param_groups must name each parameter of the module (that "
                             "requires a gradient) at most once")
        named.update(members)
        complete.append({**defaults, **{key: group[key] for key in HYPERPARAMETERS
                                        if key in group}, "params": members})
    rest = [p for p in params if p not in named]
    return complete + ([{**defaults, "params": rest}] if rest else [])


# ------------------------------------------------------------------------------- memory

def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one storage count once; a
    freed stage-3 parameter, storage resized to 0, counts 0)."""
    seen, total = set(), 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def model_state_bytes(module: nn.Module, optimizer=None) -> dict[str, int]:
    """Bytes this rank holds right now for parameters, gradients and optimizer states.

    Measured from the storages themselves: the module's parameters and their ``.grad``, plus
    what ``optimizer`` keeps (a :class:`ZeroOptimizer`'s shards; for a ``torch.optim``
    optimizer, its state tensors except the one-element ``step`` counters, which the formula
    leaves out). Returns ``{"parameters", "gradients", "optimizer", "total"}``.
    """
    params = list(module.parameters())
    kinds = {"parameters": params, "gradients": [p.grad for p in params if p.grad is not None],
             "optimizer": []}
    if isinstance(optimizer, ZeroOptimizer):
        for kind, tensors in optimizer.state_tensors().items():
            kinds[kind] = kinds[kind] + tensors
    elif optimizer is not None:
        kinds["optimizer"] = [value for state in optimizer.state.values()
                              for key, value in state.items()
                              if key != "step" and isinstance(value, torch.Tensor)]
    measured = {kind: _storage_bytes(tensors) for kind, tensors in kinds.items()}
    measured["total"] = sum(measured.values())
    return measured
