"""A submission's files are taken in as data (``reference_impl.course.grade.ingest``): regular
files with Python module names, within bounds, copied byte for byte; a link (to a classmate's
file, to /etc/passwd, to /dev/zero), a FIFO, a folder, an oversize file, one file too many, a
name that is not a module's, a linked ``labs/`` or submission folder are refused, each named
(escaped) with its reason and its numbers. Then a class graded with a link in it: the link's
owner does not get its classmate's grade, and its row says what was refused."""
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reference_impl.course import make_labs
from reference_impl.course.grade import cli, ingest as ingesting
from reference_impl.course.grade.ingest import MAX_FILE_BYTES, MAX_FILES, MAX_TOTAL_BYTES, ingest, shown
from reference_impl.course.grade.results import Graded
from reference_impl.course.sandboxing import probe
from support import REPO, nested
from support.batch_checks import GRADE, PUBLIC_CHECKS, tiers

LINK = "a symbolic link: only regular files are graded"


@pytest.fixture
def room(tmp_path):
    """A class folder with a classmate's file, an empty submission, and where copies go."""
    classmate = tmp_path / "class" / "classmate"
    classmate.mkdir(parents=True)
    (classmate / "collectives.py").write_text("RIGHT = True\n")
    mine = tmp_path / "class" / "mine"
    mine.mkdir()
    copies = tmp_path / "copies"
    copies.mkdir()
    return classmate, mine, copies


def refusals(found) -> dict[str, str]:
    return {refusal.name: refusal.reason for refusal in found.refused}


def test_regular_files_are_copied_byte_for_byte_and_other_names_left_alone(room):
    _, mine, copies = room
    texts = {"collectives.py": "def ring():\n    return 1\n".encode(),
             "alpha_beta.py": bytes(range(256)) * 10, "_empty.py": b""}
    for name, data in texts.items():
        (mine / name).write_bytes(data)
    (mine / "notes.txt").write_text("not graded")
    found = ingest(mine, copies)
    assert sorted(found.copied) == sorted(texts) and not found.refused and found.note() is None
    assert {path.name: path.read_bytes() for path in copies.iterdir()} == texts


def test_files_in_labs_are_taken_from_there(room):
    _, mine, copies = room
    (mine / "labs").mkdir()
    (mine / "labs" / "collectives.py").write_text("MINE = 1\n")
    (mine / "stray.py").write_text("AT_THE_TOP = 1\n")
    found = ingest(mine, copies)
    assert found.copied == ["collectives.py"] and not found.refused
    assert (copies / "collectives.py").read_text() == "MINE = 1\n"


@pytest.mark.parametrize("target", ["classmate", "/etc/passwd", "/dev/zero"])
def test_a_link_is_refused_wherever_it_points(room, target):
    classmate, mine, copies = room
    (mine / "labs").mkdir()
    (mine / "labs" / "collectives.py").symlink_to(
        "../../classmate/collectives.py" if target == "classmate" else target)
    found = ingest(mine, copies)
    assert refusals(found) == {"labs/collectives.py": LINK} and not found.copied
    assert found.note() == f"refused 1 file(s): labs/collectives.py ({LINK})"
    assert not list(copies.iterdir())


@pytest.mark.timeout(20)  # a FIFO opened for reading would wait for a writer forever
def test_a_fifo_and_a_folder_named_as_a_file_are_refused_and_never_read(room):
    _, mine, copies = room
    os.mkfifo(mine / "collectives.py")
    (mine / "tp_layers.py").mkdir()
    found = ingest(mine, copies)
    assert refusals(found) == {"collectives.py": "a FIFO: only regular files are graded",
                               "tp_layers.py": "a folder: only regular files are graded"}


def test_a_file_past_the_size_bound_is_refused_naming_it(room):
    _, mine, copies = room
    (mine / "big.py").write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    (mine / "just_fits.py").write_bytes(b"#" * MAX_FILE_BYTES)
    found = ingest(mine, copies)
    assert found.copied == ["just_fits.py"]
    assert refusals(found) == {"big.py": "larger than 1048576 bytes (1 MiB), the most one file "
                                         "may hold"}
    assert (copies / "just_fits.py").stat().st_size == MAX_FILE_BYTES


def test_files_past_the_total_bound_are_refused_naming_it(room):
    _, mine, copies = room
    files = MAX_TOTAL_BYTES // MAX_FILE_BYTES + 1
    for index in range(files):
        (mine / f"part{index}.py").write_bytes(b"#" * MAX_FILE_BYTES)
    found = ingest(mine, copies)
    assert found.copied == [f"part{index}.py" for index in range(files - 1)]
    assert refusals(found) == {f"part{files - 1}.py": "past 4194304 bytes (4 MiB) in all, the "
                                                      "most one submission may hand in"}


def test_files_past_the_count_bound_are_refused_naming_it(room):
    _, mine, copies = room
    for index in range(MAX_FILES + 2):
        (mine / f"m{index:03d}.py").write_text("")
    found = ingest(mine, copies)
    assert len(found.copied) == MAX_FILES == 64 and len(list(copies.iterdir())) == MAX_FILES
    reason = "past the first 64 .py files, the most one submission may hand in"
    assert refusals(found) == {"m064.py": reason, "m065.py": reason}


def test_names_that_are_not_module_names_are_refused_and_shown_escaped(room):
    _, mine, copies = room
    for name in (b"caf\xe9.py", b"=HYPERLINK(1).py", b"two\nlines.py", b"back\\slash.py",
                 b"\xe2\x80\xaeyp.exe.py"):  # a right-to-left override
        (mine / os.fsdecode(name)).write_text("")
    found = ingest(mine, copies)
    reason = "not a Python module's file name (letters, digits and _, then .py)"
    assert refusals(found) == {name: reason for name in (
        "caf\\xe9.py", "=HYPERLINK(1).py", "two\\nlines.py", "back\\\\slash.py",
        "\\u202eyp.exe.py")}
    assert not found.copied and all(refusal.name.isprintable() for refusal in found.refused)


def test_a_linked_labs_folder_is_refused_and_nothing_taken_through_it(room):
    classmate, mine, copies = room
    (mine / "labs").symlink_to(classmate)
    (mine / "collectives.py").write_text("AT_THE_TOP = 1\n")
    found = ingest(mine, copies)
    assert refusals(found) == {"labs/": "a symbolic link: only a regular folder is graded"}
    assert not found.copied and not list(copies.iterdir())


def test_a_linked_submission_folder_is_refused(room, tmp_path):
    classmate, _, copies = room
    linked = tmp_path / "class" / "linked"
    linked.symlink_to(classmate)
    found = ingest(linked, copies)
    assert found.note() == ("refused 1 file(s): the submission folder (a symbolic link: only a "
                            "regular folder is graded)")
    assert not found.copied and not list(copies.iterdir())


def test_a_missing_submission_folder_is_refused_not_raised(tmp_path):
    found = ingest(tmp_path / "gone", tmp_path)
    assert refusals(found) == {"the submission folder": "could not be read: No such file or "
                                                        "directory"}


def test_a_note_names_the_first_refusals_and_counts_the_rest(room, monkeypatch):
    _, mine, copies = room
    monkeypatch.setattr(ingesting, "NOTE_NAMES", 2)
    for index in range(4):
        (mine / f"{index}.py").write_text("")
    note = ingest(mine, copies).note()
    assert note.startswith("refused 4 file(s): 0.py (not a Python module's file name")
    assert note.count("(not a Python") == 2 and note.endswith("; and 2 more")


def test_a_folder_of_too_many_entries_is_looked_at_only_up_to_a_bound(room, monkeypatch):
    _, mine, copies = room
    monkeypatch.setattr(ingesting, "MAX_ENTRIES", 3)
    for index in range(5):
        (mine / f"m{index}.py").write_text("")
    found = ingest(mine, copies)
    assert len(found.copied) == 3
    assert refusals(found) == {"the submission folder": "more than 3 entries: the rest were not "
                                                        "looked at"}


def test_shown_makes_any_name_printable():
    assert shown("collectives.py") == "collectives.py"
    assert shown(os.fsdecode(b"\xff\x00\x1b[31m")) == "\\xff\\x00\\x1b[31m"
    assert shown("tab\there") == "tab\\there" and shown("é") == "é"


def test_a_submission_named_in_bytes_that_are_not_utf8_is_printed_escaped(tmp_path, monkeypatch,
                                                                          capsys):
    """The grader's progress lines name it printably (what the files written say of it is the
    reports' to make safe)."""
    os.makedirs(os.path.join(os.fsencode(tmp_path), b"submissions", b"caf\xe9\x1b[31m"))
    monkeypatch.setattr(cli, "grade_one", lambda submission, *rest: Graded(
        submission.name, [], [], [], 0.0))
    monkeypatch.setattr(cli, "Reaper", lambda: None)  # not this process: it grades no one here
    for writer in ("write_submission", "write_class"):
        monkeypatch.setattr(cli, writer, lambda *arguments: None)
    assert cli.main([str(tmp_path / "submissions"), "--labs", "0", "--out", str(tmp_path / "out"),
                     "--sandbox", "none"]) == 0
    printed = capsys.readouterr().out
    assert "[1/1] caf\\xe9\\x1b[31m: grading\n" in printed and printed.isascii(), printed


# -------------------------------------------------- a class graded with a link in it

ACCUMULATE = "chunks[receive_index] += received"


def submission(folder: Path, edit=None) -> Path:
    """A copy of every student file from the reference, then ``edit(collectives.py's text)``."""
    folder.mkdir(parents=True)
    for module in make_labs.modules_with_exercises():
        shutil.copy(module, folder / module.name)
    if edit is not None:
        path = folder / "collectives.py"
        path.write_text(edit(path.read_text()))
    return folder


@pytest.mark.slow
def test_a_link_to_a_classmates_file_does_not_earn_the_classmates_grade(tmp_path):
    root = tmp_path / "submissions"
    submission(root / "correct")
    wrong = submission(root / "wrong", lambda text: text.replace(ACCUMULATE, ACCUMULATE.replace(
        "+=", "=")))
    (wrong / "collectives.py").unlink()
    (wrong / "collectives.py").symlink_to("../correct/collectives.py")
    out = tmp_path / "results"
    process = subprocess.run(
        [sys.executable, "-c", GRADE, *map(str, tiers(tmp_path / "checks", PUBLIC_CHECKS)),
         str(root), "--labs", "0", "--out", str(out), "-k", "ring_all_reduce_on_a_subgroup",
         "--launch-timeout", "20", "--test-timeout", "30",
         *([] if probe() is None else ["--sandbox", "none"])],  # none: only where none is made
        cwd=REPO, capture_output=True, text=True, timeout=nested.LIMIT)
    assert process.returncode == 0, process.stdout + process.stderr
    with open(out / "grades.csv") as handle:
        sheet = {row["submission"]: row for row in csv.DictReader(handle)}
    refused = f"refused 1 file(s): collectives.py ({LINK})"
    assert (sheet["correct"]["passed"], sheet["correct"]["total"], sheet["correct"]["notes"]) == (
        "1", "1", ""), sheet["correct"]
    assert (sheet["wrong"]["passed"], sheet["wrong"]["total"]) == ("0", "1"), sheet["wrong"]
    assert sheet["wrong"]["notes"] == refused, sheet["wrong"]
    result = json.loads((out / "wrong" / "results.json").read_text())
    assert result["score"] == 0 and refused in result["output"], result
    assert "wrong: lab0 0/1 (0/1) in" in process.stdout and refused in process.stdout
