"""The kit's documents a user reads: the README (the front page) and the pages of ``docs/``.
Their commands and code blocks are run by the tests as printed."""
from __future__ import annotations

import re

from support import REPO
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def text() -> str:
    return "\n".join(path.read_text() for path in DOCUMENTS)


def command(pattern: str) -> str:
    """The one command line of the documents that matches ``pattern`` (a regex for the whole
    line), as printed."""
    found = sorted(set(re.findall(rf"^{pattern}$", text(), re.MULTILINE)))
    assert len(found) == 1, f"the documents print {len(found)} commands like {pattern!r}: {found}"
    return found[0]
