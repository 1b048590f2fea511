"""One graded run (one submission, or the reference): its limits, its log, its sandbox and view.

:class:`GradedRun` holds what the options set for the run (the time limits per launch and per
run, the output cap, the memory limit), writes the grading log the batch grader reads, and
launches a graded test's work in the run's sandbox, where a submission's code sees a student's
view of the kit (:mod:`reference_impl.course.view`); :func:`imports_of_the_reference` flags a
student file that hands in the reference. The options: docs/grading.md.
"""
import dataclasses
import json
import stat
import time
from pathlib import Path

import pytest

from reference_impl.comm.launcher import DEFAULT_TIMEOUT, launch
from reference_impl.comm.rank_failures import LaunchTimeout
from reference_impl.comm.sandbox import Sandbox
from reference_impl.comm.user_box import BOX_UID
from reference_impl.course import sandboxing, syllabus, view
from reference_impl.course.grading import Implementation, reference_imports
from reference_impl.course.private_files import owner_only

HIDDEN = "hidden"  # the marker of the graded checks under tests/labs/hidden/, not handed out
DEFAULT_AFTER_HANG = 5.0  # seconds a launch may take once the submission has hung
DEFAULT_OUTPUT_LIMIT = 8_000  # bytes of each rank's output kept, per launch
DEFAULT_SUBMISSION_BUDGET = 900.0  # seconds a graded run of one submission may take
# Bytes of a student file read in pytest's own process, to look for imports of the reference: 15
# times the largest exercise file (zero.py, 17.5 kB); parsing costs hundreds of times its size.
SOURCE_LIMIT = 256 << 10


class GradedRun:
    """The limits of one graded run (one submission) and its log."""

    def __init__(self, config):
        self.implementation = config.implementation
        self.launch_timeout = config.getoption("--launch-timeout")
        self.budget = config.getoption("--budget")
        one_submission = len(config.implementations) == 1 and \
            self.implementation.folder is not None
        if self.budget is None and one_submission:
            self.budget = DEFAULT_SUBMISSION_BUDGET
        self.sandbox_mode = config.getoption("--sandbox")
        self.hidden = tuple(config.getoption("--sandbox-hide"))
        memory = config.getoption("--memory-limit")
        self.memory_bytes = None if memory is None else int(memory * (1 << 30))
        self.sandboxed = None  # decided once graded tests are collected (decide_sandbox)
        self.view = None  # what a submission's code sees of the kit, made at its first launch
        self.sandbox_line = ""
        self.interrupted = ""  # what ended the run early, if something did
        self.after_hang = config.getoption("--after-hang")
        self.output_limit = config.getoption("--output-limit")
        self.started = time.monotonic()
        self.hung_in = None  # the first test whose launch hung
        log = config.getoption("--grading-log")
        self.log = open(log, "a", buffering=1, opener=owner_only) if log else None
        self.findings = []
        self.lab_of_test = {}  # nodeid -> its lab marker, once collected
        self.hidden_tests = set()  # the nodeids of the graded tests marked hidden
        if self.implementation.folder is not None:
            for name, labs in syllabus.labs_of_files().items():
                for finding in imports_of_the_reference(self.implementation.folder, name):
                    self.findings.append((labs, finding))
                    self.write(event="flag", labs=labs, text=finding)

    def write(self, **record) -> None:
        if self.log is not None:
            self.log.write(json.dumps(record) + "\n")

    def decide_sandbox(self) -> str:
        """Whether this run's launches are sandboxed (decided once: it starts the ranks'
        server), and the line that says what that covers."""
        if self.sandboxed is None:
            try:
                self.sandboxed, self.sandbox_line = sandboxing.choose(self.sandbox_mode)
            except ValueError as error:
                pytest.exit(str(error), returncode=pytest.ExitCode.USAGE_ERROR)
        return self.sandbox_line

    def sandbox(self, scratch: Path, implementation) -> Sandbox | None:
        """The sandbox of this run's launches (None without one): ``scratch`` (the run's
        temporary folder) writable, the implementation's folder readable; a submission's
        launches see the kit as a student does (:mod:`reference_impl.course.view`)."""
        self.decide_sandbox()
        if not self.sandboxed:
            return None
        folder = implementation.folder
        # The reference's launches, too, find the folders a handout leaves out empty (the hidden
        # checks among them), so that the suite on the reference reads no more than a grade does.
        readable, hidden, replaced = (), (*self.hidden, *view.hidden_folders()), ()
        if folder is not None:
            if self.view is None:
                self.view = view.students_view(sorted(set(self.lab_of_test.values())))
            readable, hidden = (str(folder),), (*self.hidden, *self.view.hidden)
            replaced = self.view.replaced
        return Sandbox(writable=(str(scratch),), cache=str(scratch / "sandbox-cache"),
                       readable=readable, hidden=hidden, replaced=replaced,
                       memory_bytes=self.memory_bytes,
                       uid=BOX_UID if self.sandbox_mode == "user" else None)

    def seen_as_a_student(self, implementation) -> Implementation:
        """``implementation``, its files standing in for the modules its view shows as stubs."""
        if self.view is None:
            return implementation
        return dataclasses.replace(implementation, stood_in=self.view.stubbed)

    def launch(self, fn, world_size, args, kwargs, backend, timeout, nodeid, implementation,
               scratch):
        """The launcher under this run's limits, in its sandbox, with a data-only result."""
        limit = timeout or DEFAULT_TIMEOUT  # the test's own, where it needs longer
        if self.launch_timeout is not None:
            limit = min(limit, self.launch_timeout)  # the grader's cap, when given
        if self.hung_in is not None:
            limit = min(limit, self.after_hang)
        if self.budget is not None:
            remaining = self.budget - (time.monotonic() - self.started)
            if remaining <= 0:
                pytest.fail(f"not run: the graded run's time budget of {self.budget:g} s "
                            f"(--budget) is spent{self._hang_note()}", pytrace=False)
            limit = min(limit, remaining)
        self.write(event="launch", nodeid=nodeid, world_size=world_size, backend=backend)
        sandbox = self.sandbox(scratch, implementation)  # makes the view, where there is one
        try:
            return launch(fn, world_size, *args, backend=backend, timeout=limit,
                          results="data", output_limit=self.output_limit,
                          rank_setup=self.seen_as_a_student(implementation).enter,
                          sandbox=sandbox, **kwargs)
        except LaunchTimeout as error:
            self.write(event="hang", nodeid=nodeid, world_size=world_size)
            if self.hung_in is not None:
                pytest.fail(f"{error}{self._hang_note()}", pytrace=False)
            self.hung_in = nodeid
            raise

    def _hang_note(self) -> str:
        if self.hung_in is None:
            return ""
        return (f" (the submission already hung in {self.hung_in}, so launches after it get "
                f"at most {self.after_hang:g} s)")

    def in_hidden_tier(self, nodeid: str) -> bool:
        """A test marked ``hidden``, or a module in a ``hidden`` folder that could not be
        collected (it has no tests to carry the marker)."""
        if "::" in nodeid:
            return nodeid in self.hidden_tests
        return Path(nodeid).parent.name == HIDDEN


def imports_of_the_reference(folder: Path, name: str) -> list[str]:
    """Where student file ``<name>.py`` imports the reference it must write (see
    :func:`reference_imports`), read in pytest's own process within :data:`SOURCE_LIMIT`
    bytes: a file that is larger, not a plain file, or that the parser cannot take is not
    read, and is flagged for a look by hand (no pass, no crash)."""
    path = folder / f"{name}.py"
    if not path.exists():
        return []  # the graded tests report it
    unchecked = f"{path.name} was not checked for imports of the reference implementation"
    try:
        found = path.stat()
    except OSError as error:
        return [f"{unchecked}: {type(error).__name__}"]
    if not stat.S_ISREG(found.st_mode):
        return [f"{unchecked}: it is not a plain file (look at it by hand)"]
    if found.st_size > SOURCE_LIMIT:
        return [f"{unchecked}: it is {found.st_size:,} bytes, more than the {SOURCE_LIMIT:,} "
                "the check reads (look at it by hand)"]
    try:
        return reference_imports(folder, [name])
    except (ValueError, RecursionError, MemoryError, OSError) as error:
        return [f"{unchecked}: the parser could not read it ({type(error).__name__})"]
