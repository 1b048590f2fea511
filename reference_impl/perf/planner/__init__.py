"""The topology planner (lab 7): which TP x CP x PP x DP layout, ZeRO stage, micro-batch and
recomputation to use for a model on a cluster, with the math written out, validated against
published training runs.

    python -m reference_impl.perf.planner --preset 70b --nodes 16 --gpus-per-node 8 --explain
    python -m reference_impl.perf.planner --validate
    python -m reference_impl.perf.planner calibrate --dry-run

One idea per module, mixture-of-experts models included (expert parallelism carved out of dp).
The modules and the model, term by term: docs/library.md, 'The planner's model, term by term'.
"""
from reference_impl.perf.planner.hardware import GB, GPUS, GiB, Cluster, cluster_of
from reference_impl.perf.planner.layout import Layout, check_layout
from reference_impl.perf.planner.model_spec import PRESETS, ModelSpec, get_model
from reference_impl.perf.planner.plans import Plan, evaluate, plan, recommend, table
from reference_impl.perf.planner.explain import (batch_sensitivity, explain, overlapped,
                                                 practice_comparison, trust, why)

__all__ = ["GB", "GPUS", "GiB", "Cluster", "cluster_of", "Layout", "check_layout", "PRESETS",
           "ModelSpec", "get_model", "Plan", "evaluate", "plan", "recommend", "table",
           "batch_sensitivity", "explain", "overlapped", "practice_comparison", "trust", "why"]
