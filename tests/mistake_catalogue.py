"""The mistakes students make, one entry each, and the graded test that must catch each one.

Every entry is a mutation of the reference solution (the text ``find``, which must occur exactly
once in the student file ``module``'s reference module, becomes ``replace``): handed in as a
submission, the graded tests selected by ``select`` (a ``pytest -k`` expression) in ``lab`` must
fail, and their output must contain ``message``, the words that name the mistake.
``tests/test_mistake_catalogue.py`` hands in every entry and checks both.

This file holds solution lines, so the student handout leaves it out.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    name: str  # what the student did, in a student's words
    lab: str  # "lab2"
    module: str  # the student file, without .py: "tp_layers"
    find: str  # exact text of the reference module (once)
    replace: str  # what the student wrote instead
    select: str  # pytest -k expression: the graded tests that must catch it
    message: str  # a substring of their failure output that names the mistake


# ---------------------------------------------------------------- lab 0 and lab 1
LAB0_LAB1: list[Mistake] = []

# ---------------------------------------------------------------- lab 2 and lab 3
LAB2_LAB3: list[Mistake] = []

# ---------------------------------------------------------------- lab 4
LAB4: list[Mistake] = []

# ---------------------------------------------------------------- lab 5
LAB5: list[Mistake] = [
    Mistake("the bucket's sum written back without dividing by the group size", "lab5",
            "ddp_hooks", "            bucket.flat.div_(self.world_size)\n", "",
            "ddp_from_hooks and few", "averaging forgotten"),
    Mistake("the async handles never waited before the step", "lab5", "ddp_hooks",
            "            bucket.handle.wait()\n", "", "ddp_from_hooks and few",
            "waiting on handles missing before the step"),
    Mistake("a bucket launched at its first gradient instead of its last", "lab5",
            "ddp_hooks", "if bucket.ready == len(bucket.params):", "if bucket.ready == 1:",
            "ddp_from_hooks and few", "flushed before all its gradients are ready"),
    Mistake("the hooks all-reduce inside no_sync too", "lab5", "ddp_hooks",
            "        if not self.require_sync:\n            return\n", "",
            "ddp_from_hooks and few", "all-reducing during no_sync"),
    Mistake("the all-reduce over the world instead of the data-parallel group", "lab5",
            "ddp_hooks", "group=self.group, async_op=True", "async_op=True",
            "ddp_from_hooks and few", "the wrong group"),
    Mistake("ZeRO-1 updates every rank's shard with the first slice of the gradient", "lab5",
            "zero", "grad = shard.my_slice(param.grad)",
            "grad = param.grad.reshape(-1)[:shard.size]", "zero1_matches and 2",
            "a shard updated with another slice"),
    Mistake("SageMaker's rule applied to Megatron's layout", "lab5", "data_parallel",
            'if convention == "megatron" or is_tp_distributed(owner, parameter):',
            "if is_tp_distributed(owner, parameter):", "gradient_plan_follows",
            "megatron plan: nothing goes over DP_GROUP"),
]

# ---------------------------------------------------------------- lab 6 and lab 7
LAB6_LAB7: list[Mistake] = []

CATALOGUE = LAB0_LAB1 + LAB2_LAB3 + LAB4 + LAB5 + LAB6_LAB7
