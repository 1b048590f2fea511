"""Reference implementation of the course: every parallel component, tested against a
single-device model.

    model.py        the single-device GPT every parallel component is built from and checked against
    checks.py       assert_close: one difference, named with its rank and likely cause
    equivalence.py  output, input gradient, every parameter gradient, weights after a step
    comm/           the launcher, collectives, alpha-beta cost, collective tracer, rank groups
    tp/             tensor parallelism: Megatron layers, attention, SageMaker linear, vocab, SP
    memory/         activation memory, measured and counted; recomputation
    pipeline/       schedules as data, validator, simulator, executor, partition, Gantt charts
    hybrid/         data parallelism, ZeRO, the 3D-parallel GPT, checkpoints
    perf/           profiling, scaling, step timing, the topology planner
    train.py        the 3D trainer (torchrun or CPU ranks)
    benchmarks/     measurements printed side by side (never imported by the library)
    course/         generating the student files, grading, building the decks

docs/architecture.md draws what depends on what.
"""
