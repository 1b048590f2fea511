"""The course, lab by lab: the one place its facts live.

The pytest plugin registers a marker per lab from it, the graded runs and the student handout
take each lab's student files from it, and the tests check the README's course map, the
notebooks' stated times and the solution markers of the reference modules against it
(``tests/course/test_syllabus.py``). The GPUs a lab needs are checked against the world sizes its
graded tests launch (``tests/course/test_term.py``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lab:
    number: int
    topic: str
    files: tuple[str, ...]  # the student files the lab's exercises are in (module names)
    minutes: int  # the time a student needs, as the notebook states it: an estimate from the
    #               reading and the written lines, until a class's own times replace it
    gpus: int  # GPUs its graded tests need under NCCL: the largest world size they launch (0: none,
    #            every check runs in one CPU helper)
    notebook: str  # its notebook's name in labs/ and solutions/, without .ipynb
    builds_on: tuple[int, ...] = ()  # the earlier labs whose modules its notebook and files use
    #                                  (tests/course/test_term.py follows their imports)

    @property
    def marker(self) -> str:
        """Its pytest marker and its name in hints and grade sheets: ``"lab2"``."""
        return f"lab{self.number}"

    @property
    def earlier_labs(self) -> str:
        """Its earlier labs, as the course maps' column says them: ``"labs 1, 2"``, ``"none"``."""
        if not self.builds_on:
            return "none"
        return f"lab{'s' * (len(self.builds_on) > 1)} {', '.join(map(str, self.builds_on))}"

    @property
    def needs(self) -> str:
        """What it builds on, as its notebook and the course map say it."""
        if not self.builds_on:
            return "no earlier lab"
        numbers = [str(number) for number in self.builds_on]
        listed = numbers[0] if len(numbers) == 1 else f"{', '.join(numbers[:-1])} and {numbers[-1]}"
        return (f"lab{'s' * (len(numbers) > 1)} {listed}: the released solutions, or your own "
                "files until then")


LABS: tuple[Lab, ...] = (
    Lab(0, "collectives", ("collectives", "alpha_beta"), 90, 4, "lab0_collectives"),
    Lab(1, "rank groups", ("groups", "process_groups"), 75, 8, "lab1_rank_groups"),
    Lab(2, "tensor-parallel layers", ("tp_collectives", "tp_layers", "sagemaker_linear"), 120, 4,
        "lab2_tp_layers"),
    Lab(3, "tensor-parallel attention", ("tp_attention", "vocab_parallel"), 120, 4,
        "lab3_tp_attention", (2,)),
    Lab(4, "pipeline parallelism", ("pipeline_schedules", "pipeline_executor"), 120, 4,
        "lab4_pipeline"),
    Lab(5, "hybrid and 3D", ("data_parallel", "ddp_hooks", "zero"), 150, 4, "lab5_hybrid",
        (1, 2, 3, 4)),
    Lab(6, "profiling and scaling", ("trace_analysis",), 90, 2, "lab6_profiling", (0, 2, 3, 4, 5)),
    Lab(7, "the production slice", ("capacity",), 90, 0, "lab7_production", (0, 1, 4)),
    Lab(8, "context parallelism", ("online_softmax", "ring_attention", "load_balance"), 120, 4,
        "lab8_context_parallel"),
    Lab(9, "expert parallelism", ("router", "expert_groups", "token_exchange",
        "expert_parallel"), 120, 4,
        "lab9_expert_parallel", (1,)),
)


def lab(marker: str) -> Lab:
    """The lab of a marker (``"lab3"``), or a ValueError naming the labs there are."""
    for each in LABS:
        if each.marker == marker:
            return each
    raise ValueError(f"no lab {marker!r}: the labs are {', '.join(each.marker for each in LABS)}")


def markers() -> list[str]:
    return [each.marker for each in LABS]


def parse_labs(text: str) -> list[str]:
    """``"2,3"`` or ``"lab2,lab3"`` -> ``["lab2", "lab3"]`` (a command's ``--labs``), or a
    ValueError naming the labs that do not exist and those that do."""
    labs = [lab if lab.startswith("lab") else f"lab{lab}" for lab in text.split(",")]
    unknown = [lab for lab in labs if lab not in markers()]
    if unknown:
        raise ValueError(f"--labs: no such lab {', '.join(unknown)}; the labs are "
                         f"{', '.join(markers())}")
    return labs


def labs_of_files() -> dict[str, list[str]]:
    """Student file -> the labs whose exercises it holds: ``{"tp_layers": ["lab2"], ...}``."""
    found: dict[str, list[str]] = {}
    for each in LABS:
        for name in each.files:
            found.setdefault(name, []).append(each.marker)
    return found


def student_files() -> list[str]:
    """Every student file's module name, in course order."""
    return list(labs_of_files())
