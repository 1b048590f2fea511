"""Pipeline parallelism (lab 4). Schedules are data (per-rank action lists); one validator, one
simulator and one executor serve every schedule; stages are cut by parameter count. Figures
and traces: ``pipeline_gantt``.
"""
from reference_impl.pipeline.pipeline_schedules import (
    Action, Schedule, build_schedule, gpipe, interleaved_one_f_one_b, naive, one_f_one_b,
    zb_h1)
from reference_impl.pipeline.pipeline_validator import ScheduleError, validate
from reference_impl.pipeline.pipeline_simulator import Timeline, bubble_formula, simulate
from reference_impl.pipeline.pipeline_executor import pipeline_train_step, run_schedule
from reference_impl.pipeline.pipeline_partition import gpt_layers, partition

__all__ = [
    "Action",
    "Schedule",
    "build_schedule",
    "gpipe",
    "interleaved_one_f_one_b",
    "naive",
    "one_f_one_b",
    "zb_h1",
    "ScheduleError",
    "validate",
    "Timeline",
    "bubble_formula",
    "simulate",
    "pipeline_train_step",
    "run_schedule",
    "gpt_layers",
    "partition",
]
