"""The time limit of a run the suite starts inside a test (pytest, a notebook, a documented
command): below the per-test limit of the kit's pytest plugin, so that the nested run's own
limit fires first and the failure says which run it was."""
from reference_impl.course.pytest_plugin import DEFAULT_TEST_TIMEOUT

LIMIT = DEFAULT_TEST_TIMEOUT - 60  # seconds
