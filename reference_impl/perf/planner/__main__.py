from reference_impl.perf.planner.cli import main

main()
