import sys

from reference_impl.benchmarks.grading_cost.benchmark import main

sys.exit(main())
