"""The learning rate of every step: linear warm-up, then cosine decay to a floor.

    schedule = WarmupCosine(lr=3e-4, min_lr=3e-5, warmup_steps=100, decay_steps=1000)
    set_lr(optimizer, schedule.lr_at(n))   # before step n = 1, 2, ...

As nanoGPT, torchtitan and Megatron-LM train transformers (Loshchilov & Hutter 2017,
"SGDR: Stochastic Gradient Descent with Warm Restarts", for the cosine; Goyal et al. 2017,
"Accurate, Large Minibatch SGD", for the warm-up): Adam's first updates, made from moment
estimates of a few batches, are the least reliable, so the rate climbs from lr / warmup_steps to
lr over the first ``warmup_steps`` steps, then follows half a cosine down to ``min_lr`` at step
``decay_steps`` and stays there. Step numbers count from 1 (the n-th update), as Megatron-LM's
scheduler does after its increment, so the warm-up's last step runs at lr and step
``decay_steps`` at min_lr.

The rate is a pure function of the step number: a run resumed from a checkpoint at step k
(which stores k) continues with exactly the rates of a run that never stopped, with no
scheduler state to save.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up over ``warmup_steps``, cosine from ``lr`` to ``min_lr`` at ``decay_steps``;
    a ValueError names a setting that cannot work, with the numbers."""

    lr: float
    min_lr: float
    warmup_steps: int
    decay_steps: int

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"the learning rate must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must be between 0 and lr = {self.lr}, got {self.min_lr}")
        if self.decay_steps < 1:
            raise ValueError(f"decay_steps must be at least 1, got {self.decay_steps}")
        if not 0 <= self.warmup_steps <= self.decay_steps:
            raise ValueError(f"warmup_steps must be between 0 and decay_steps = "
                             f"{self.decay_steps}, got {self.warmup_steps}")

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (1 for the first update)."""
        if step < 1:
            raise ValueError(f"steps count from 1, got {step}")
        if step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if step >= self.decay_steps:
            return self.min_lr
        progress = (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))


def set_lr(optimizer, lr: float) -> None:
    """Give every parameter group of ``optimizer`` (a torch one or a ``ZeroOptimizer``) the
    learning rate ``lr`` for its next step."""
    for group in optimizer.param_groups:
        group["lr"] = lr
