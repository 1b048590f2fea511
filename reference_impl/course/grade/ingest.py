"""A submission's files taken in as data: what the grader copies out of a submission folder,
outside any sandbox, before its graded run.

Only regular files whose names are Python module names are copied, each opened without
following a link (``O_NOFOLLOW``) and checked once open (``fstat``), and read up to a bound:
a link to a classmate's file, to the results or to ``/etc/shadow``, a device, a FIFO or a
folder is refused, never read. The submission folder and its ``labs/`` must be folders, not
links to one (a linked ``labs/`` is refused with all it holds, and the files beside it are not
taken instead). Bounds per file, per count and per submission keep a huge or endless file out.
Every refusal is reported against the submission, its name escaped for display.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILE_BYTES = 1 << 20  # one file
MAX_FILES = 64  # .py files copied from one submission
MAX_TOTAL_BYTES = 4 << 20  # all of one submission's files together
MAX_ENTRIES = 4096  # entries of a submission's folder looked at
MODULE_FILE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.py")
NOTE_NAMES = 10  # refusals named in full in a submission's note
_LINK_REASON = "a symbolic link: only regular files are graded"
_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link"))


def _flags(*names: str) -> int:
    """``os.open`` flags by name (POSIX's: this module imports elsewhere, but grades there)."""
    return os.O_RDONLY | sum(getattr(os, name, 0) for name in names)


# A FIFO opened without O_NONBLOCK would wait for a writer; a terminal would become ours.
_READ_FLAGS = _flags("O_NOFOLLOW", "O_NONBLOCK", "O_NOCTTY", "O_CLOEXEC")
_FOLDER_FLAGS = _flags("O_DIRECTORY", "O_NOFOLLOW", "O_CLOEXEC")


@dataclass(frozen=True)
class Refusal:
    """A file (or folder) of a submission that was not taken, and why."""
    name: str  # as displayed: escaped, relative to the submission folder
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


@dataclass
class Ingested:
    """What was copied out of a submission (file names) and what was refused."""
    copied: list[str] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    def note(self) -> str | None:
        """The line for the submission's row, or None when nothing was refused."""
        if not self.refused:
            return None
        named = "; ".join(map(str, self.refused[:NOTE_NAMES]))
        more = len(self.refused) - NOTE_NAMES
        return (f"refused {len(self.refused)} file(s): {named}"
                + (f"; and {more} more" if more > 0 else ""))


def shown(name: str) -> str:
    """``name`` (as ``os.fsdecode`` gives it: undecodable bytes as surrogates) as printable
    text: a byte that is not UTF-8 as ``\\xNN``, a control or invisible character as Python
    escapes it, a backslash doubled."""
    pieces = []
    for character in name:
        if "\udc80" <= character <= "\udcff":
            pieces.append(f"\\x{ord(character) - 0xDC00:02x}")
        elif character == "\\":
            pieces.append("\\\\")
        elif character.isprintable():
            pieces.append(character)
        else:
            pieces.append(ascii(character)[1:-1])
    return "".join(pieces)


def ingest(submission: Path, into: Path) -> Ingested:
    """Copy the student files of ``submission`` (at its top, or in its ``labs/``) into the
    folder ``into``, within the bounds; report what was refused."""
    found = Ingested()
    try:
        top = os.open(submission, _FOLDER_FLAGS)
    except OSError as error:
        found.refused.append(Refusal("the submission folder", _why_not_a_folder(
            error, lambda: os.lstat(submission))))
        return found
    try:
        _ingest_folder(top, found, into)
    finally:
        os.close(top)
    return found


def _ingest_folder(top: int, found: Ingested, into: Path) -> None:
    try:
        labs = os.stat("labs", dir_fd=top, follow_symlinks=False)
    except OSError:
        labs = None
    if labs is None or not (stat.S_ISDIR(labs.st_mode) or stat.S_ISLNK(labs.st_mode)):
        _copy_files(top, "", found, into)
        return
    try:
        inner = os.open("labs", _FOLDER_FLAGS, dir_fd=top)
    except OSError as error:
        found.refused.append(Refusal("labs/", _why_not_a_folder(error, lambda: labs)))
        return
    try:
        _copy_files(inner, "labs/", found, into)
    finally:
        os.close(inner)


def _why_not_a_folder(error: OSError, status) -> str:
    """Why a folder could not be opened: ``status()`` is what it is (not followed)."""
    try:
        mode = status().st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISLNK(mode):
        return "a symbolic link: only a regular folder is graded"
    if mode is not None and not stat.S_ISDIR(mode):
        return f"{_kind(mode)}: only a regular folder is graded"
    return f"could not be read: {error.strerror}"


def _copy_files(folder: int, prefix: str, found: Ingested, into: Path) -> None:
    names, looked_at = [], 0
    with os.scandir(folder) as entries:
        for entry in entries:
            looked_at += 1
            if looked_at > MAX_ENTRIES:
                found.refused.append(Refusal(prefix or "the submission folder", f"more than "
                                             f"{MAX_ENTRIES} entries: the rest were not looked at"))
                break
            if entry.name.endswith(".py"):
                names.append(entry.name)
    total = 0
    for name in sorted(names):
        shown_name = prefix + shown(name)
        if not MODULE_FILE.fullmatch(name):
            found.refused.append(Refusal(shown_name, "not a Python module's file name "
                                         "(letters, digits and _, then .py)"))
            continue
        if len(found.copied) >= MAX_FILES:
            found.refused.append(Refusal(shown_name, f"past the first {MAX_FILES} .py files, "
                                         "the most one submission may hand in"))
            continue
        data, reason = _read_regular(folder, name)
        if data is not None and total + len(data) > MAX_TOTAL_BYTES:
            data, reason = None, (f"past {MAX_TOTAL_BYTES} bytes ({MAX_TOTAL_BYTES >> 20} MiB) "
                                  "in all, the most one submission may hand in")
        if data is None:
            found.refused.append(Refusal(shown_name, reason))
            continue
        _write_new(into / name, data)
        total += len(data)
        found.copied.append(name)


def _read_regular(folder: int, name: str) -> tuple[bytes | None, str]:
    """The file's bytes (and ""), or None and why it is refused. Only what is a regular file
    before it is opened is opened (a device is never opened), and only what is one once open
    is read."""
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except OSError as error:
        return None, f"could not be read: {error.strerror}"
    if not stat.S_ISREG(mode):
        return None, f"{_kind(mode)}: only regular files are graded"
    try:
        handle = os.open(name, _READ_FLAGS, dir_fd=folder)
    except OSError as error:
        return None, _LINK_REASON if error.errno == errno.ELOOP else (
            f"could not be read: {error.strerror}")
    try:
        mode = os.fstat(handle).st_mode
        if not stat.S_ISREG(mode):
            return None, f"{_kind(mode)}: only regular files are graded"
        data = _read_at_most(handle, MAX_FILE_BYTES + 1)
    finally:
        os.close(handle)
    if len(data) > MAX_FILE_BYTES:
        return None, (f"larger than {MAX_FILE_BYTES} bytes ({MAX_FILE_BYTES >> 20} MiB), the "
                      "most one file may hold")
    return data, ""


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def _read_at_most(handle: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(handle, min(limit - size, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_new(path: Path, data: bytes) -> None:
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(handle, view):]
    finally:
        os.close(handle)
