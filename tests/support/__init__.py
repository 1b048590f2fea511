"""What the kit's tests share: the repository's paths, documents, nested pytest runs, handouts,
graded cases, the mistake catalogue. ``pytest`` puts ``tests/`` on the path
(``pythonpath`` in ``pyproject.toml``), so a test imports ``from support.nested import ...``."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
GRADED_TESTS = TESTS / "labs"
