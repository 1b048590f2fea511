"""The sandbox a graded launch runs in: what its ranks can reach (files, processes, the
network, the caller) and what they are limited to, and that everything they start ends with
the launch. Each attack is tried from inside and must fail there."""
import multiprocessing.forkserver
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from reference_impl.comm import launcher, sandbox
from reference_impl.comm.launcher import launch
from reference_impl.comm.rank_failures import LaunchTimeout, RankFailure
from reference_impl.comm.sandbox import Sandbox, SandboxError
from reference_impl.course.sandboxing import probe
from support.leftovers import sleepers
from support import REPO

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"no sandbox here: {probe()}")
SLEEP_MARK = "1000.125"  # what a rank leaves running, if anything survives


def sandboxed(fn, *args, world_size=2, timeout=30.0, **options):
    return launch(fn, world_size, *args, sandbox=Sandbox(**options), timeout=timeout,
                  results="data")


def attempt(action) -> str:
    try:
        action()
    except Exception as error:  # noqa: BLE001 - the attack's failure is the result
        return type(error).__name__
    return "done"


# ----------------------------------------------------------------- rank functions

def try_writes(outside_file, writable_folder):
    return {"outside": attempt(lambda: open(outside_file, "a").close()),
            "tmpdir": attempt(lambda: tempfile.mkstemp()),
            "writable": attempt(lambda: open(os.path.join(writable_folder, "b"), "w").close()),
            "shm": attempt(lambda: open("/dev/shm/c", "w").close()),
            "remount": attempt(lambda: subprocess.run(["mount", "-o", "remount,rw", "/"],
                                                      check=True, capture_output=True))}


def look_at(hidden, readable):
    return sorted(os.listdir(hidden)), sorted(os.listdir(readable))


def reach_the_caller(caller):
    own = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    return {"signal": attempt(lambda: os.kill(caller, signal.SIGKILL)),
            "parent": os.getppid() != caller, "processes": own}


def connect(port):
    with socket.socket() as client:
        client.settimeout(2.0)
        return attempt(lambda: client.connect(("127.0.0.1", port)))


def connect_unix(path):
    with socket.socket(socket.AF_UNIX) as client:
        return attempt(lambda: client.connect(path))


def read_relative(name):
    return attempt(lambda: open(name).read()), os.getcwd()


def all_reduce_rank():
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return value.item()


def run_away():
    """What a hostile rank leaves behind: a process in a session of its own, twice forked."""
    subprocess.Popen(["sleep", SLEEP_MARK], start_new_session=True)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", SLEEP_MARK])
        os._exit(0)
    return dist.get_rank()


def allocate(gib):
    return attempt(lambda: bytearray(gib << 30)), attempt(lambda: torch.empty(gib << 28))


def write_big(megabytes):
    path = os.path.join(os.environ["TMPDIR"], "big")
    return attempt(lambda: open(path, "wb").write(b"x" * (megabytes << 20)))


def stuck_forever():
    while True:
        time.sleep(0.1)


def killed():
    os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------- tests

def test_files_are_read_only_but_the_scratch_folders(tmp_path):
    outside = tmp_path / "grades.csv"
    outside.write_text("yours\n")
    writable = tmp_path / "scratch"
    writable.mkdir()
    for result in sandboxed(try_writes, str(outside), str(writable), writable=(str(writable),)):
        assert result == {"outside": "OSError", "tmpdir": "done", "writable": "done",
                          "shm": "done", "remount": "CalledProcessError"}, result
    assert outside.read_text() == "yours\n"
    # The kit: read-only too (or, for a grader who does not own it, not theirs to write).
    assert sandboxed(try_writes, str(REPO / "README.md"), str(writable), world_size=1)[0][
        "outside"] in ("OSError", "PermissionError")


def test_hidden_folders_are_empty_except_what_stays_readable(tmp_path):
    hidden = tmp_path / "class"
    (hidden / "other_student").mkdir(parents=True)
    (hidden / "me").mkdir()
    (hidden / "me" / "tp_layers.py").write_text("")
    seen_hidden, seen_mine = sandboxed(
        look_at, str(hidden), str(hidden / "me"), world_size=1, readable=(str(hidden / "me"),),
        hidden=(str(hidden), str(tmp_path / "not_there")))[0]
    assert "other_student" not in seen_hidden and seen_mine == ["tp_layers.py"]


def read_and_overwrite(path):
    return open(path).read(), attempt(lambda: open(path, "w").write("mine"))


def test_a_replaced_file_reads_as_its_stand_in_and_cannot_be_written(tmp_path):
    solution, stub = tmp_path / "solution.py", tmp_path / "view" / "stub.py"
    solution.write_text("the answer\n")
    stub.parent.mkdir()
    stub.write_text("raise NotImplementedError\n")
    text, written = sandboxed(read_and_overwrite, str(solution), world_size=1,
                              replaced=((str(solution), str(stub)),))[0]
    assert text == "raise NotImplementedError\n" and written in ("OSError", "PermissionError")
    assert solution.read_text() == "the answer\n" and stub.read_text() == text


def test_the_caller_cannot_be_named_signalled_or_seen():
    for result in sandboxed(reach_the_caller, os.getpid()):
        assert result["signal"] == "ProcessLookupError" and result["parent"], result
        assert max(result["processes"]) < 100, result  # its own namespace's numbers only


def test_no_network_but_the_ranks_own_loopback():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert connect(port) == "done"  # reachable from here...
        assert sandboxed(connect, port, world_size=1) == ["ConnectionRefusedError"]  # ...not there
    assert sandboxed(all_reduce_rank, world_size=3) == [6.0, 6.0, 6.0]  # the ranks talk


def test_no_unix_socket_of_the_machine_or_the_caller_in_reach(tmp_path):
    """The rank server's socket, and a service's in the temporary folder, are out of reach:
    through one, code could run outside the sandbox."""
    launcher.start_rank_server()
    server = multiprocessing.forkserver._forkserver._forkserver_address
    with socket.socket(socket.AF_UNIX) as service:
        service.bind(str(tmp_path / "service.sock"))
        service.listen()
        assert connect_unix(str(tmp_path / "service.sock")) == "done"  # reachable here
        for path in (server, str(tmp_path / "service.sock")):
            assert sandboxed(connect_unix, path, world_size=1) == ["FileNotFoundError"], path


RELATIVE_READ = """
import os, sys
from reference_impl.comm.launcher import launch
from reference_impl.comm.sandbox import Sandbox
sys.path.insert(0, {tests!r})
os.chdir({secret!r})
from library.comm.test_sandbox import read_relative
print(launch(read_relative, 1, "answers.txt", sandbox=Sandbox(hidden=({hidden!r},)),
             results="data", timeout=30)[0])
"""


@pytest.mark.slow  # waits on purpose, or on several launches
def test_a_hidden_working_folder_is_no_way_in(tmp_path):
    """Ranks start in their server's working folder; if it is hidden, they start in the
    launch's own instead, not in the covered one (where relative paths would still reach)."""
    secret = tmp_path / "class" / "grader"
    secret.mkdir(parents=True)
    (secret / "answers.txt").write_text("42")
    code = RELATIVE_READ.format(tests=str(REPO / "tests"), secret=str(secret),
                                hidden=str(tmp_path / "class"))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    read, cwd = eval(run.stdout.strip().splitlines()[-1])  # a tuple of two strings
    assert read == "FileNotFoundError" and "class" not in cwd, (read, cwd)


def test_whatever_a_rank_starts_ends_with_the_launch():
    assert sandboxed(run_away) == [0, 1]
    time.sleep(0.2)
    assert not sleepers(SLEEP_MARK), f"left running: {sleepers(SLEEP_MARK)}"


def test_memory_and_file_size_are_limited():
    # 4 GiB: room for a rank's own start (a CUDA build of torch maps more than 1 GiB).
    limited = sandboxed(allocate, 8, world_size=1, memory_bytes=4 << 30)[0]
    assert list(limited) == ["MemoryError", "RuntimeError"], limited
    assert sandboxed(write_big, 3, world_size=1, file_bytes=2 << 20) == ["OSError"]


def fill_shared_memory(megabytes):
    """Write ``megabytes`` into /dev/shm, 1 MiB files at a time (each within the file limit)."""
    def fill():
        for index in range(megabytes):
            with open(f"/dev/shm/block{index}", "wb") as handle:
                handle.write(b"x" * (1 << 20))
    return attempt(fill)


def test_shared_memory_is_bounded_for_the_whole_launch():
    """/dev/shm is outside a process's memory limit: the launch's, all of it, holds at most one
    process's worth."""
    limits = {"memory_bytes": 4 << 30, "file_bytes": 2 << 20}
    assert sandboxed(fill_shared_memory, 8, world_size=1, **limits) == ["done"]
    assert sandboxed(fill_shared_memory, 4097, world_size=1, **limits) == ["OSError"]


@pytest.mark.slow  # waits on purpose, for the time limit
def test_a_stuck_rank_still_shows_where_it_was():
    with pytest.raises(LaunchTimeout) as stuck:
        sandboxed(stuck_forever, timeout=3.0)
    assert "stuck_forever" in str(stuck.value) and stuck.value.ranks == [0, 1]
    assert not sleepers(SLEEP_MARK)


def test_a_rank_killed_by_a_signal_is_named():
    with pytest.raises(RankFailure, match="killed by signal SIGKILL"):
        sandboxed(killed, world_size=1)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_every_start_method_can_be_sandboxed(start_method):
    if start_method == "fork" and torch.cuda.is_available():
        pytest.skip("the fork start method is refused on a machine with a GPU")
    assert launch(all_reduce_rank, 2, sandbox=Sandbox(), timeout=60.0, results="data",
                  start_method=start_method) == [3.0, 3.0]


def test_no_sandbox_here_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(sandbox, "unavailable", lambda: "no namespaces in this test")
    with pytest.raises(SandboxError, match="no namespaces in this test"):
        sandboxed(all_reduce_rank)


def test_the_sandbox_is_linux_only_and_says_so():
    assert sandbox.unavailable() is None if sys.platform.startswith("linux") else \
        "namespaces" in sandbox.unavailable()
