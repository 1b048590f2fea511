"""A submission's scratch, bounded in size and files: run a command with a folder of its own
that is a size-limited tmpfs, in a mount namespace of its own (as root; as another user, in a
user namespace of its own too, mapped to that same user, where the machine allows one:
elsewhere the command runs as it is, its files bounded one at a time by the sandbox's file-size
limit).

    python -m reference_impl.course.grade.scratch FOLDER BYTES FILES -- COMMAND...

The batch grader runs each graded run this way (``running.graded_run_command``): whatever the
submission writes, in its launches' folders or pytest's, lands there and is gone with the run.
This process becomes the command (``exec``), so the grader's process tree is unchanged.
"""
from __future__ import annotations

import os
import sys

from reference_impl.comm.sandbox import (CLONE_NEWNS, CLONE_NEWUSER, MS_NODEV, MS_NOSUID,
                                         MS_PRIVATE, MS_REC, SandboxError, map_to_the_same_user,
                                         mount, unshare)

SCRATCH_BYTES = 2 << 30  # what one submission's graded run may keep on disk at once
SCRATCH_FILES = 100_000  # and how many files and folders


def bounded(folder: str, size: int, files: int, subfolders=("tmp",)) -> bool:
    """Make ``folder`` a tmpfs of ``size`` bytes and ``files`` inodes for this process and
    what it starts, with ``subfolders`` in it; False (nothing done) where this process may not
    (not Linux; not root, and no user namespace may be made)."""
    if not sys.platform.startswith("linux"):
        return False
    if os.getuid() == 0:
        unshare(CLONE_NEWNS, what="unshare (a mount namespace for the scratch)")
    else:
        uid, gid = os.getuid(), os.getgid()
        try:  # the user namespace's capabilities mount the tmpfs; an exec drops them
            unshare(CLONE_NEWUSER | CLONE_NEWNS, what="unshare (user and mount namespaces)")
        except SandboxError:
            return False
        map_to_the_same_user(uid, gid)
    mount(None, "/", None, MS_REC | MS_PRIVATE, what="make / private")
    mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={size},nr_inodes={files},mode=755", what=f"a tmpfs scratch at {folder}")
    for name in subfolders:
        os.makedirs(os.path.join(folder, name), exist_ok=True)
    return True


def main(argv: list[str]) -> None:
    folder, size, files, separator, *command = argv
    if separator != "--" or not command:
        sys.exit("usage: python -m reference_impl.course.grade.scratch FOLDER BYTES FILES -- "
                 "COMMAND...")
    bounded(folder, int(size), int(files))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
