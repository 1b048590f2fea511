"""A class graded in parts (``--part i/n``) and merged, as a SLURM job array grades it: every
submission in exactly one part, and the merge writes the same ``grades.csv`` and ``report.md``,
byte for byte, as grading the class at once. The job-array scripts run here as documented, with
a stand-in ``sbatch`` that runs each task at once with the scheduler's variables set by hand."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from reference_impl.course import make_labs
from reference_impl.course.grade import merge
from reference_impl.course.grade.parts import (Part, graded_from_data, graded_to_data, load_part,
                                               parse_part, part_of, save_part)
from reference_impl.course.grade.results import Flag, Graded
from reference_impl.course.grade.results import TestResult as CheckResult
from reference_impl.course.sandboxing import probe
from support import REPO, documents, nested

PARTS = 3
SELECTED = "test_ring_all_reduce_on_3_ranks"  # one multi-rank check: the mistake below fails it
ACCUMULATE = "chunks[receive_index] += received"
# The batch grader refuses to grade unsandboxed unless asked: where no sandbox can be made, ask.
SANDBOX = [] if probe() is None else ["--sandbox", "none"]
SCRIPTS = REPO / "reference_impl" / "slurm"

# The scheduler, stood in for: an array's tasks run one after another with SLURM_ARRAY_TASK_ID
# and SLURM_ARRAY_TASK_COUNT set, a --wrap job runs its command; each call is logged.
SBATCH = r"""#!/bin/bash
echo "sbatch $*" >> "$SBATCH_LOG"
array="" wrap="" script=()
for argument in "$@"; do  # sbatch's options, up to the script; the rest are the script's
    case "${#script[@]}:$argument" in
        0:--array=*) array=${argument#--array=} ;;
        0:--wrap=*) wrap=${argument#--wrap=} ;;
        0:--*) ;;
        *) script+=("$argument") ;;
    esac
done
if [ -n "$array" ]; then
    last=${array#0-}
    for task in $(seq 0 "$last"); do
        SLURM_ARRAY_JOB_ID=1000 SLURM_ARRAY_TASK_ID=$task SLURM_ARRAY_TASK_COUNT=$((last + 1)) \
            bash "${script[@]}" >> "$SBATCH_LOG" 2>&1 || echo "task $task exited $?" >> "$SBATCH_LOG"
    done
    echo 1000
else
    bash -c "$wrap" >> "$SBATCH_LOG" 2>&1
    echo 1001
fi
"""


def test_a_part_is_given_as_index_and_count():
    assert parse_part("0/3") == Part(0, 3) and parse_part("2/3") == Part(2, 3)
    for text in ("3/3", "-1/3", "1/0", "1", "a/b", "1/3/4"):
        with pytest.raises(ValueError, match="--part"):
            parse_part(text)


def test_every_submission_falls_in_exactly_one_stable_part():
    names = [f"student-{number}" for number in range(300)] + [os.fsdecode(b"st\xffudent")]
    for count in (1, 2, 3, 7):
        holders = [[Part(index, count).holds(name) for index in range(count)] for name in names]
        assert all(sum(held) == 1 for held in holders)
        sizes = [sum(held[index] for held in holders) for index in range(count)]
        assert min(sizes) > 0.5 * len(names) / count, sizes  # spread, not all in one part
    # The same on every machine and run: a hash of the name's bytes, not Python's hash().
    assert [part_of(f"student-{number}", 3) for number in range(8)] == [
        part_of(f"student-{number}", 3) for number in range(8)]
    assert part_of("alice", 3) == int.from_bytes(
        __import__("hashlib").sha256(b"alice").digest()[:8], "big") % 3


def graded(name: str, passed: bool) -> Graded:
    test = CheckResult("test_x[\udcff]", "lab0", passed, False, "" if passed else "E\x00 = |`",
                      0.25, 1.0 * passed, 1.0, hidden=not passed)
    return Graded(name, [test], [Flag(("lab0",), "imports the reference")], ["note"], 1.5)


def test_a_graded_submission_survives_the_part_file_unchanged(tmp_path):
    original = graded(os.fsdecode(b"st\xffudent"), False)
    assert graded_from_data(graded_to_data(original)) == original
    path = save_part(Part(1, 2), ["lab0"], 4, [original], tmp_path)
    assert load_part(path)["graded"] == [original]


def test_the_merge_refuses_a_missing_part_or_parts_of_another_grading(tmp_path):
    save_part(Part(0, 3), ["lab0"], 2, [graded("a", True)], tmp_path)
    save_part(Part(2, 3), ["lab0"], 2, [graded("b", False)], tmp_path)
    with pytest.raises(ValueError, match="parts 1 of 3 are missing"):
        merge.merged(tmp_path)
    save_part(Part(1, 3), ["lab1"], 2, [], tmp_path)
    with pytest.raises(ValueError, match="labs"):
        merge.merged(tmp_path)
    save_part(Part(1, 3), ["lab0"], 3, [], tmp_path)
    with pytest.raises(ValueError, match="class_size"):
        merge.merged(tmp_path)
    save_part(Part(1, 3), ["lab0"], 2, [graded("a", True)], tmp_path)  # graded twice
    with pytest.raises(ValueError, match="the class has 2"):
        merge.merged(tmp_path)
    save_part(Part(1, 3), ["lab0"], 2, [], tmp_path)
    assert [one.submission for one in merge.merged(tmp_path)[0]] == ["a", "b"]
    with pytest.raises(SystemExit):
        merge.main([str(tmp_path / "nowhere")])


def names_in_every_part(per_part: int) -> list[str]:
    """Submission names, ``per_part`` in each of the PARTS parts."""
    chosen = {index: [] for index in range(PARTS)}
    for number in range(1000):
        name = f"student-{number:03d}"
        if len(chosen[part_of(name, PARTS)]) < per_part:
            chosen[part_of(name, PARTS)].append(name)
    return sorted(name for names in chosen.values() for name in names)


def make_class(root: Path) -> Path:
    """Six submissions, two per part: solved, untouched stubs and a realistic mistake."""
    for number, name in enumerate(names_in_every_part(2)):
        folder = root / name
        folder.mkdir(parents=True)
        for module in make_labs.modules_with_exercises():
            source = REPO / "labs" / module.name if number % 3 == 1 else module
            shutil.copy(source, folder / module.name)
        if number % 3 == 2:
            path = folder / "collectives.py"
            path.write_text(path.read_text().replace(ACCUMULATE, ACCUMULATE.replace("+=", "=")))
    return root


def environment(tmp_path: Path) -> dict:
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "sbatch").write_text(SBATCH)
    (bin_folder / "sbatch").chmod(0o755)
    path = os.pathsep.join([str(bin_folder), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "SBATCH_LOG": str(tmp_path / "sbatch.log"),
            "PYTHON": sys.executable}


def without_times(path: Path):
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        data.pop("execution_time")
        return json.dumps(data, indent=1).splitlines()  # a line-by-line diff when they differ
    suite = ElementTree.parse(path).getroot()
    for element in suite.iter():
        element.attrib.pop("time", None)
    return ElementTree.tostring(suite)


@pytest.mark.slow
def test_a_class_graded_in_parts_on_a_job_array_equals_the_class_graded_at_once(tmp_path):
    submissions = make_class(tmp_path / "submissions")
    options = ["-k", SELECTED, "--jobs", "2", *SANDBOX]
    at_once = tmp_path / "at_once"
    run = subprocess.run([sys.executable, "-m", "reference_impl.course.grade", str(submissions),
                          "--labs", "0", "--out", str(at_once), *options], cwd=REPO,
                         capture_output=True, text=True, timeout=nested.LIMIT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    # The documented command, with this class's numbers in its places.
    printed = shlex.split(documents.command(r"bash reference_impl/slurm/grade_class\.sh .*"))
    assert printed[:2] == ["bash", "reference_impl/slurm/grade_class.sh"] and len(printed) >= 6
    in_parts = tmp_path / "in_parts"
    run = subprocess.run([*printed[:2], str(PARTS), str(submissions), "0", str(in_parts),
                          *options], cwd=REPO, env=environment(tmp_path), capture_output=True,
                         text=True, timeout=nested.LIMIT)
    log = (tmp_path / "sbatch.log").read_text()
    assert run.returncode == 0, run.stdout + run.stderr + log[-4000:]
    assert "submitted the parts as job array 1000 and the merge as job 1001" in run.stdout
    calls = [line for line in log.splitlines() if line.startswith("sbatch ")]
    assert f"--array=0-{PARTS - 1}" in calls[0] and "--dependency=afterany:1000" in calls[1], log
    for index in range(PARTS):
        assert f"task {index} of {PARTS}" in log and f"part {index}/{PARTS} of a class of 6" in log
    assert "exited" not in log and "merged 6 submission(s)" in log, log[-4000:]

    for name in ("grades.csv", "report.md"):
        assert (in_parts / name).read_bytes() == (at_once / name).read_bytes(), name
    sheet = (at_once / "grades.csv").read_text()
    assert sheet.count(",1,1,") == 2 and sheet.count(",0,1,") == 4, sheet  # the grades differ
    for folder in at_once.iterdir():
        if folder.is_dir():
            for name in ("results.json", "junit.xml"):
                assert without_times(in_parts / folder.name / name) == without_times(
                    folder / name), (folder.name, name)
    assert len([path for path in in_parts.iterdir() if path.name.startswith("student-")]) == 6
