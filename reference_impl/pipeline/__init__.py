"""Pipeline parallelism (lab 4). Schedules are data (per-rank action lists); one validator,
one simulator and one executor serve every schedule, over the messages and the exchange plan
a schedule implies; stages are cut by parameter count; the course's GPT is cut into stages
beside the executor. Figures and traces: ``reference_impl.figures.pipeline_gantt``.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "pipeline_schedules": ["Action", "Schedule", "gpipe", "naive", "one_f_one_b", "zb_h1"],
    "interleaved": ["interleaved_one_f_one_b"],
    "named_schedules": ["build_schedule"],
    "pipeline_messages": ["exchange_plan", "messages"],
    "pipeline_validator": ["ScheduleError", "validate"],
    "pipeline_simulator": ["Timeline", "bubble_formula", "simulate"],
    "pipeline_executor": ["pipeline_train_step", "run_schedule"],
    "gpt_stages": ["build_gpt_stages", "gpt_loss"],
    "pipeline_partition": ["gpt_layers", "partition"],
})
