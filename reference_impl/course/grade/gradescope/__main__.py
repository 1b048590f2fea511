"""``python -m reference_impl.course.grade.gradescope``: see the package's docstring."""
import sys

from reference_impl.course.grade.gradescope.build import main

sys.exit(main())
