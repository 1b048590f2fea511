"""What practitioners run: the layouts of public training recipes for a model, laid on any
cluster and global batch (data parallelism fills the GPUs the recipe's model split leaves) and
evaluated by the same estimate as every other layout, so the planner's answer can be set
beside them term by term (``explain.practice``).

Sources (by public title):

* NeMo 24.07, docs/source/performance/performance_summary.md: Llama 2 70B, TP 4 x PP 4 with
  20 virtual stages, micro-batch 1, sequence 4096, global batch 128 on 64 H100s; Llama 3 70B,
  TP 4 x PP 4 x CP 2 with 5 virtual stages, micro-batch 1, sequence 8192, global batch 128;
  both FP8, Megatron-Core's distributed optimizer (published_runs.py holds the rows).
* torchtitan, torchtitan/models/llama3/train_configs/llama3_70b.toml, "a preset for 64 A100
  GPUs": TP 8, FSDP over the remaining GPUs, full activation checkpointing, a local batch of
  8 sequences of 8192 tokens per forward.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from reference_impl.perf.planner.hardware import Cluster
from reference_impl.perf.planner.layout import Layout
from reference_impl.perf.planner.model_spec import ModelSpec
from reference_impl.perf.planner.plans import Plan, evaluate
from reference_impl.perf.planner.published_runs import NEMO, PUBLISHED_RUNS

TORCHTITAN_PRESET = "torchtitan llama3_70b.toml"


@dataclass(frozen=True)
class PracticeLayout:
    """A recipe's split of the model and its micro-batch (sequences per forward), as
    published; laid on another cluster it keeps all of them, DP takes the rest."""
    name: str
    source: str
    tp: int
    pp: int
    cp: int = 1
    v: int = 1
    zero: int = 1
    accounting: str = "megatron"
    recompute: str | None = None
    micro_batch: int = 1

    def layout(self, model: ModelSpec, cluster: Cluster) -> Layout:
        """The recipe on ``cluster``: DP = GPUs / (tp cp pp); a ValueError names what does
        not divide."""
        split = self.tp * self.cp * self.pp
        if cluster.num_gpus % split:
            raise ValueError(f"{self.name}: tp {self.tp} x cp {self.cp} x pp {self.pp} = "
                             f"{split} does not divide the {cluster.num_gpus} GPUs")
        return Layout(self.tp, self.pp, cluster.num_gpus // split, self.zero, self.micro_batch,
                      self.recompute, True, self.cp, self.v, self.accounting)


def _nemo(run_name: str, name: str) -> PracticeLayout:
    run = next(r for r in PUBLISHED_RUNS if r.source == NEMO and r.name == run_name)
    return PracticeLayout(name, f"{NEMO} ({run.model.name}, seq {run.model.seq_len}, "
                                f"batch {run.global_batch})", run.tp, run.pp, run.cp,
                          run.v or 1, run.zero, run.accounting, run.recompute,
                          run.micro_batch or 1)


PRACTICE = {
    "70b": (
        _nemo("NeMo Llama 2 70B TP4 PP4 VP20", "NeMo Llama 2 70B"),
        _nemo("NeMo Llama 3 70B TP4 PP4 CP2 VP5", "NeMo Llama 3 70B"),
        PracticeLayout("torchtitan 70B", TORCHTITAN_PRESET, 8, 1, zero=3, accounting="fsdp",
                       recompute="full", micro_batch=8),
    ),
}


def practice_layouts(model: ModelSpec) -> tuple[PracticeLayout, ...]:
    """The recipes stored for ``model`` (by preset name; none for the others)."""
    return PRACTICE.get(model.name, ())


def practice_plans(model: ModelSpec, cluster: Cluster, global_batch: int,
                   tp_comm_overlap: bool = False) -> list[tuple[PracticeLayout, Plan | str]]:
    """Each recipe evaluated on ``cluster`` at ``global_batch``, or why it cannot run there."""
    results = []
    for recipe in practice_layouts(model):
        try:
            layout = recipe.layout(model, cluster)
            if tp_comm_overlap:
                layout = replace(layout, tp_comm_overlap=True)
            results.append((recipe, evaluate(model, cluster, layout, global_batch)))
        except ValueError as error:
            results.append((recipe, str(error)))
    return results
