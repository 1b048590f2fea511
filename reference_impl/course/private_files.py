"""Files of a graded run that only their owner may read: its grading log and its output hold
the hidden checks' results, out of reach of a box user (:mod:`reference_impl.comm.user_box`)
that shares the machine's file system."""
from __future__ import annotations

import os


def owner_only(path, flags: int) -> int:
    """``open``'s opener: a file made with mode 0600."""
    return os.open(path, flags, 0o600)
