"""The rule of an expert-parallel split, shared by the trainer and the planner: EP groups are
cut from the data-parallel replicas (each EP rank is a replica for everything but the experts)
and each EP rank holds experts / ep of the experts."""
from __future__ import annotations


def check_expert_split(experts: int, ep: int, dp: int, model: str = "the model") -> None:
    """A ValueError with the numbers unless ``ep`` divides ``dp`` and ``experts``."""
    if ep < 1:
        raise ValueError(f"ep must be >= 1, got {ep}")
    if ep == 1:
        return
    if not experts:
        raise ValueError(f"ep {ep} needs a mixture-of-experts model; {model} is dense")
    if dp % ep or experts % ep:
        raise ValueError(f"ep {ep} must divide dp {dp} and the {experts} experts: EP groups are "
                         f"cut from the replicas, and each EP rank holds experts / ep of them")
