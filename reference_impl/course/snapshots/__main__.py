"""``python -m reference_impl.course.snapshots``: see the package's docstring."""
import sys

from reference_impl.course.snapshots import main

sys.exit(main())
