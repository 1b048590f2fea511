"""The Gradescope container a lab needs, from what grading it measured
(``python -m reference_impl.benchmarks.grading_cost``, kept in ``measured.json``)."""
from __future__ import annotations

import json
from pathlib import Path

GIB = 1 << 30
MEASURED = Path(__file__).resolve().parent / "measured.json"
MEMORY_MARGIN = 1.5  # a container holds this many times the measured peak
# Gradescope's autograder containers, (CPUs, GiB): the default is half a CPU and 768 MB; the
# larger ones keep its 1.5 GB per CPU.
GRADESCOPE_CONTAINERS = ((0.5, 0.75), (1.0, 1.5), (2.0, 3.0), (4.0, 6.0))


def container(peak_bytes: int, margin: float = MEMORY_MARGIN) -> tuple[float, float] | None:
    """The smallest Gradescope container (CPUs, GiB) holding ``margin`` x the peak; None if
    none does."""
    need = peak_bytes * margin / GIB
    return next((size for size in GRADESCOPE_CONTAINERS if size[1] >= need), None)


def container_seconds(wall: float, cpu: float, cpus: float) -> float:
    """A submission's time in a container of ``cpus`` CPUs, at least: its wall time here, or
    its CPU time spread over those CPUs where that is longer."""
    return max(wall, cpu / cpus)


def memory_name(gib: float) -> str:
    """A container's memory as Gradescope names it: 768 MB, 1.5 GB."""
    return f"{gib * 1024:.0f} MB" if gib < 1 else f"{gib:g} GB"


def settings(labs: list[str]) -> dict:
    """For grading ``labs`` together: each lab's measured cost and the container it needs,
    the container for all of them (the largest), and the machine they were measured on."""
    measured = json.loads(MEASURED.read_text())
    per_lab = {}
    for lab in labs:
        cost = measured["labs"][lab]
        cpus, gib = container(int(cost["peak_gib"] * GIB))
        per_lab[lab] = {**cost, "cpus": cpus, "memory": memory_name(gib),
                        "seconds_at_least": round(container_seconds(cost["wall_s"],
                                                                    cost["cpu_s"], cpus))}
    cpus = max(lab["cpus"] for lab in per_lab.values())
    memory = next(memory_name(gib) for size_cpus, gib in GRADESCOPE_CONTAINERS
                  if size_cpus == cpus)
    return {"container": {"cpus": cpus, "memory": memory,
                          "seconds_at_least": sum(lab["seconds_at_least"]
                                                  for lab in per_lab.values())},
            "per_lab": per_lab, "measured_on": measured["machine"]}
