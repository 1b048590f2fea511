"""Reference implementation of the course: every parallel component, tested against a
single-device model (``model/``, checked with ``checks.py`` and ``equivalence.py``).

Subpackages by idea: ``comm/`` (launcher, collectives, rank groups), ``tp/``, ``cp/``, ``moe/``,
``memory/``, ``pipeline/``, ``hybrid/``, ``perf/`` (profiling, scaling, the planner),
``figures/``, ``benchmarks/`` (measurements, never imported by the library) and ``course/``
(student files, grading, decks); ``train.py`` is the 3D trainer. What depends on what:
docs/architecture.md; what each part does: docs/library.md.
"""
