"""``python -m reference_impl.course.grade``: see the package's docstring."""
import sys

from reference_impl.course.grade.cli import main

sys.exit(main())
