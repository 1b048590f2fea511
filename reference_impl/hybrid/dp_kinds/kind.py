"""What a data-parallel kind does to a parallelised model, step by step: its checks, its
wrapping, its optimizer, its gradient finish, and the pieces of state each rank holds.

The base class is plain replication (every replica holds every parameter, gradient and
optimizer state of its TP shard whole); the sharding kinds override what they shard. A
``Piece`` is what a rank holds of one tensor, in the flat coordinates of its TP shard
(the checkpoints' unit: ``hybrid/checkpoint.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Piece:
    """Elements ``[start, start + flat.numel())`` of a tensor flattened: this rank's part."""

    flat: torch.Tensor  # a view where the rank's own storage allows one (loads write into it)
    start: int = 0


class DataParallelKind:
    """Replicated data parallelism; subclasses say how they reduce and what they shard."""

    name = ""
    reduces_in_hooks = False  # reduces from post-accumulate-grad hooks, during the backward

    # ------------------------------------------------------------ checks
    def check_schedule(self, schedule) -> None:
        """A split backward's W adds the weight gradients without autograd: no hook fires."""
        if self.reduces_in_hooks and schedule.split_backward:
            raise ValueError(
                f"dp_kind {self.name} with the {schedule.name} schedule: {self.name} reduces "
                f"each gradient from a post-accumulate-grad hook, and a split backward's W adds "
                f"the linear layers' weight gradients without autograd, so no hook fires; use "
                f"dp_kind sync or zero1, or a schedule without W (gpipe, 1f1b, interleaved)")

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse an optimizer this kind cannot run (every torch optimizer, here)."""

    # ------------------------------------------------------------ building
    def wrap(self, model) -> None:
        """After TP, CP and recomputation: what the backward needs (hooks, sharding)."""

    def after_forward_only(self, model) -> None:
        """After a forward with no backward (an evaluation): put back what the backward would
        have (nothing here)."""

    def build_optimizer(self, model, optimizer) -> torch.optim.Optimizer:
        """The optimizer to step with, from one made over ``model.parameters()``."""
        self.check_optimizer(optimizer)
        return optimizer

    # ------------------------------------------------------------ a step
    def reduce(self, model, convention: str):
        """After the schedule's backwards: leave each gradient the global batch's mean in
        :meth:`gradient`; returns a ``SyncReport`` where the kind makes one."""
        raise NotImplementedError

    def gradient(self, model, parameter) -> torch.Tensor | None:
        """The gradient this rank holds for ``parameter`` after :meth:`reduce`."""
        return parameter.grad

    def shard_group(self, model):
        """The group whose ranks hold different pieces of each gradient (None: whole ones)."""
        return None

    # ------------------------------------------------------------ state
    def full_values(self, model) -> dict[int, torch.Tensor]:
        """{id(parameter): its whole value (of its TP shard)}; collective where sharded."""
        return {id(p): p.detach() for p in model.parameters()}

    def parameter_piece(self, model, parameter) -> Piece:
        return Piece(parameter.detach().view(-1))

    def state_pieces(self, model, optimizer, parameter) -> dict[str, Piece]:
        """Every optimizer state tensor shaped as ``parameter`` (Adam's moments, SGD's
        momentum), as this rank holds it."""
        state = optimizer.state.get(parameter, {})
        return {key: Piece(value.view(-1)) for key, value in state.items()
                if torch.is_tensor(value) and value.shape == parameter.shape}

    def steps(self, optimizer, parameter) -> int:
        """How many updates ``parameter``'s optimizer state has seen (Adam's bias correction)."""
        step = optimizer.state.get(parameter, {}).get("step", 0)
        return int(step.item() if torch.is_tensor(step) else step)

    def start_state(self, optimizer, parameter, keys, steps: int) -> None:
        """Create ``parameter``'s optimizer state with ``keys`` (zeros) and ``steps``, for a
        checkpoint to load into."""
        state = optimizer.state[parameter]
        for key in keys:
            state[key] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
        if "exp_avg" in keys:  # Adam's step: on the parameter's device when fused, as torch's
            fused = any(group.get("fused") for group in optimizer.param_groups)
            state["step"] = torch.tensor(float(steps), dtype=torch.float32,
                                         device=parameter.device if fused else "cpu")
