"""Pipeline parallelism (lab 4). Schedules are data (per-rank action lists); one validator, one
simulator and one executor serve every schedule; stages are cut by parameter count. Figures
and traces: ``reference_impl.figures.pipeline_gantt``.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "pipeline_schedules": ["Action", "Schedule", "build_schedule", "gpipe", "naive",
        "one_f_one_b", "zb_h1"],
    "interleaved": ["interleaved_one_f_one_b"],
    "pipeline_validator": ["ScheduleError", "validate"],
    "pipeline_simulator": ["Timeline", "bubble_formula", "simulate"],
    "pipeline_executor": ["pipeline_train_step", "run_schedule"],
    "pipeline_partition": ["gpt_layers", "partition"],
})
