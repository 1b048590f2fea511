"""Measuring and planning (labs 6 and 7): named profiling ranges (``ranges``), per-rank and
merged traces (``traces``), interval algebra (``intervals``) and a trace's summary
(``trace_summary``; how they fit: ``docs/profiling.md``), strong and weak scaling with an
alpha-beta prediction, step timing side by side, and the topology planner. Each of
``profiling``, ``scaling`` and ``planner`` is also a command (``python -m
reference_impl.perf.<name>``); they are imported from their modules.
"""
from reference_impl.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "step_timing": ["median_step_seconds"],
})
