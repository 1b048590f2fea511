"""The instructor's machine check (``python -m reference_impl.course.check_machine``), run as
the documents print it: on a CPU machine it runs what it can, says what it skipped and why, and
writes its report as Markdown and JSON."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import documents
from support import nested
from reference_impl.course import syllabus

pytestmark = pytest.mark.slow

COMMAND = documents.command(r"python -m reference_impl\.course\.check_machine.*")


# The graded tests themselves run in tests/labs; here the check's graded run is cut (through
# PYTEST_ADDOPTS, which leaves the command as printed) to a few cheap tests of every lab, enough
# to read each lab's counts in the report.
SOME_OF_EACH_LAB = "-k 'contract or golden or zero_shards or tp_attention_matches'"


def test_the_machine_check_runs_as_printed_and_reports(tmp_path):
    environment = {**os.environ, "PYTEST_ADDOPTS": SOME_OF_EACH_LAB,
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    process = subprocess.run(COMMAND, shell=True, cwd=tmp_path, env=environment,
                             capture_output=True, text=True, timeout=nested.LIMIT)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    folder = tmp_path / "machine-check"
    report = json.loads((folder / "machine-check.json").read_text())
    text = (folder / "machine-check.md").read_text()
    assert text in process.stdout

    gpus = report["machine"]["gpus"]
    assert report["machine"]["sandbox"].startswith(("sandbox: namespaces: ", "sandbox: none ("))
    assert "\n- Sandbox: " in text  # the mode graded launches get here, and what it covers
    limits = report["machine"]["limits"]
    if "processes" in limits:  # sandboxed: as root, the process limit holds by a cgroup only
        assert limits["processes"].startswith("holds") or (
            os.getuid() == 0 and limits["memory of the whole tree"].startswith("not bounded"))
    assert "| limit | here |" in text
    assert [row["lab"] for row in report["labs"]] == syllabus.markers()
    reduce = report["all-reduce"]
    assert reduce["ranks"] == (gpus or 2) and len(reduce["bus GB/s"]) == len(reduce["bytes"])
    assert all(seconds > 0 for seconds in reduce["seconds"])
    auto = report["graded tests"]["auto"]
    for marker in syllabus.markers():
        counts = auto["labs"][marker]
        assert counts["passed"] > 0 and counts["failed"] == 0, (marker, counts)
    assert re.search(r"^MFU: ", "\n".join(report["mfu"]["lines"]), re.MULTILINE)
    if not gpus:
        assert "nccl" not in report["graded tests"]
        assert any("--backend nccl: no GPU here" in why for why in report["skipped"])
        assert "## Skipped\n\n- the graded tests with --backend nccl" in text
