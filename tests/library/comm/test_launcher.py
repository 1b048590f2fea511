"""The launcher's guarantees: values come back, failures name their rank, nothing hangs,
no process is left behind, and no rank is forked from the caller's process."""
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from reference_impl.comm import launcher
from reference_impl.comm.device import current_device
from reference_impl.comm.launcher import launch
from reference_impl.comm.rank_failures import LaunchTimeout, RankFailure
from reference_impl.course.grade.running import children_of
from support import REPO

SLACK = 5.0  # seconds allowed beyond a launch's timeout for reporting and cleanup


def child_pids() -> set[int]:
    """Live (non-zombie) child processes of this process, read from /proc."""
    return children_of(os.getpid(), running_only=True)


@pytest.fixture(autouse=True)
def no_leftover_processes():
    if not sys.platform.startswith("linux"):
        yield
        return
    launcher.start_rank_server()  # it lives as long as this process: not a leftover
    before = child_pids()
    yield
    left = child_pids() - before
    assert not left, f"processes left behind by the launch: {sorted(left)}"


def wait_until_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()
                 and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


# ----------------------------------------------------------------- rank functions

def rank_sum(offset):
    value = torch.tensor([float(dist.get_rank() + offset)], device=current_device())
    dist.all_reduce(value)
    return dist.get_rank(), dist.get_world_size(), value.item()


def intra_op_threads():
    return torch.get_num_threads()


def rank_one_raises():
    if dist.get_rank() == 1:
        raise ValueError("rank one is broken on purpose")
    dist.all_reduce(torch.ones(1, device=current_device()))


def crossed_receives():
    # Both ranks receive first: the classic pipeline deadlock.
    buffer = torch.zeros(1, device=current_device())
    dist.recv(buffer, src=1 - dist.get_rank())


def rank_one_never_returns():
    if dist.get_rank() == 1:
        while True:
            time.sleep(0.05)
    return "done"


def rank_one_killed():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1, device=current_device()))


def unpicklable_result():
    return threading.Lock()


def parent_pid_and_variable(name):
    return os.getppid(), os.environ.get(name)


# ----------------------------------------------------------------------- tests

@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_every_rank_returns_its_value(run_on_ranks, world_size):
    results = run_on_ranks(rank_sum, world_size, 10)
    expected_sum = sum(rank + 10.0 for rank in range(world_size))
    assert results == [(rank, world_size, expected_sum) for rank in range(world_size)]


def large_tensor():
    return torch.arange(300_000, dtype=torch.float64) * (dist.get_rank() + 1)


def test_tensors_come_back_by_value_after_the_rank_has_exited(run_on_ranks):
    # Larger than a pipe's buffer, and read after the ranks are gone: the data must be copied,
    # not shared through the rank's process.
    for _ in range(3):
        results = run_on_ranks(large_tensor, 4)
        for rank, tensor in enumerate(results):
            assert torch.equal(tensor.cpu(), torch.arange(300_000, dtype=torch.float64) * (rank + 1))


def test_one_intra_op_thread_per_rank_unless_asked():
    assert launch(intra_op_threads, 2, backend="gloo") == [1, 1]
    assert launch(intra_op_threads, 2, backend="gloo", threads=2) == [2, 2]


def test_a_raising_rank_is_reported_with_its_rank_and_traceback(run_on_ranks):
    start = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        run_on_ranks(rank_one_raises, 2, timeout=20)
    assert time.monotonic() - start < 20 + SLACK
    assert caught.value.rank == 1
    message = str(caught.value)
    assert message.startswith("rank 1 failed: ValueError: rank one is broken on purpose")
    assert "in rank_one_raises" in message  # the rank's own traceback


@pytest.mark.slow  # waits on purpose, for the time limit
def test_ranks_stuck_in_a_collective_time_out_showing_where(run_on_ranks):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as caught:
        run_on_ranks(crossed_receives, 2, timeout=3)
    assert time.monotonic() - start < 3 + SLACK
    assert caught.value.ranks == [0, 1]
    assert "did not finish within 3 s" in str(caught.value)
    for rank in (0, 1):
        assert "in crossed_receives" in caught.value.stacks[rank]
        assert "in recv" in caught.value.stacks[rank]


def receive_into_a_smaller_buffer():
    if dist.get_rank() == 0:
        dist.send(torch.ones(64), dst=1)
    else:
        dist.recv(torch.empty(16), src=0)


def test_a_crash_inside_the_backend_names_its_likely_cause(run_on_ranks):
    """gloo aborts (or says 'Received data size doesn't match') when a receive buffer is
    smaller than the message: the failure names that mistake, not only gloo's words."""
    with pytest.raises(RankFailure) as caught:
        run_on_ranks(receive_into_a_smaller_buffer, 2, timeout=20)
    assert "Likely cause: " in str(caught.value) and "receive buffer" in str(caught.value), (
        str(caught.value)[:2000])


@pytest.mark.slow  # waits on purpose, or on several launches
def test_a_rank_that_never_returns_times_out(run_on_ranks):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as caught:
        run_on_ranks(rank_one_never_returns, 2, timeout=2)
    assert time.monotonic() - start < 2 + SLACK
    assert caught.value.ranks == [1]
    assert "in rank_one_never_returns" in caught.value.stacks[1]


def test_a_rank_killed_by_a_signal_is_reported(run_on_ranks):
    start = time.monotonic()
    with pytest.raises(RankFailure, match="rank 1 failed: killed by signal SIGKILL"):
        run_on_ranks(rank_one_killed, 2, timeout=20)
    assert time.monotonic() - start < 20 + SLACK


def test_a_result_that_cannot_be_sent_back_is_reported(run_on_ranks):
    with pytest.raises(RankFailure, match="rank 0 failed: .*pickle"):
        run_on_ranks(unpicklable_result, 1, timeout=20)


def test_functions_defined_in_a_notebook_cell_can_be_launched():
    scale = 2

    def local_function():  # plain pickle cannot send it: it travels by value (cloudpickle)
        return dist.get_rank() * scale

    assert launch(local_function, 3, backend="gloo") == [0, 2, 4]


def test_ranks_are_not_forked_from_the_caller(monkeypatch):
    # A process forked from one that has run a backward pass (or touched CUDA) fails at its
    # first backward on a GPU machine; ranks come from the rank server instead. They still see
    # the caller's environment as it is at the launch.
    torch.ones(2, requires_grad=True).sum().backward()
    monkeypatch.setenv("LAUNCHER_TEST_VARIABLE", "set after the rank server started")
    for parent, variable in launch(parent_pid_and_variable, 2, "LAUNCHER_TEST_VARIABLE",
                                   backend="gloo"):
        assert parent != os.getpid()
        assert variable == "set after the rank server started"


def test_fork_is_refused_on_a_machine_with_a_gpu(monkeypatch):
    monkeypatch.setattr(launcher, "gpu_count", lambda: 2)
    with pytest.raises(ValueError, match="'fork' is refused on a machine with a GPU"):
        launch(intra_op_threads, 2, backend="gloo", start_method="fork")


def test_arguments_that_cannot_travel_are_refused_with_what_to_do():
    with pytest.raises(TypeError, match="cannot send intra_op_threads .* pass data"):
        launch(intra_op_threads, 1, threading.Lock(), backend="gloo")


def test_a_function_the_rank_cannot_import_is_named(tmp_path):
    # A module loaded from a file by path exists only in the caller: a rank cannot import it.
    path = tmp_path / "loaded_by_path.py"
    path.write_text("def work():\n    return 1\n")
    spec = importlib.util.spec_from_file_location("loaded_by_path_only", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        with pytest.raises(RankFailure, match="could not load the launched function.*"
                                              "loaded_by_path_only.*must be importable"):
            launch(module.work, 1, backend="gloo", timeout=20)
    finally:
        del sys.modules[spec.name]


@pytest.mark.parametrize("bad, message", [
    (dict(world_size=0), "world_size must be a positive integer, got 0"),
    (dict(world_size=2, timeout=0), "timeout must be positive"),
    (dict(world_size=2, backend="mpi"), "unknown backend 'mpi'"),
])
def test_bad_arguments_are_refused_clearly(bad, message):
    with pytest.raises(ValueError, match=message):
        launch(intra_op_threads, **bad)


def test_nccl_without_enough_gpus_is_refused():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"{gpus + 1} ranks but {gpus} GPUs"):
        launch(intra_op_threads, gpus + 1, backend="nccl")


def test_world_size_must_match_torchrun(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="asked for 2 ranks but .* WORLD_SIZE=4"):
        launch(intra_op_threads, 2)


# ------------------------------------------------ whole programs, in subprocesses

def run_script(body: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(body)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


SUM_FOUR_RANKS = """
    import torch, torch.distributed as dist
    from reference_impl.comm.launcher import launch
    def work():
        value = torch.tensor([dist.get_rank() + 1.0])
        for _ in range(20):
            dist.all_reduce(value)
            value /= dist.get_world_size()
        return value.item()
    print("results", launch(work, 4, backend="gloo", timeout=30))
"""


@pytest.mark.slow  # waits on purpose, or on several launches
def test_two_launches_at_once_do_not_collide():
    first, second = run_script(SUM_FOUR_RANKS), run_script(SUM_FOUR_RANKS)
    for process in (first, second):
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output
        assert "results [2.5, 2.5, 2.5, 2.5]" in output


SLEEPING_RANKS = """
    import os, signal, sys, time, torch.distributed as dist
    from reference_impl.comm.launcher import launch
    # Ctrl-C as in a terminal, even where this test runs in the background (a shell without
    # job control starts its background jobs with SIGINT ignored, and children inherit that)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    def sleep_forever(folder):
        open(os.path.join(folder, str(os.getpid())), "w").close()
        while True:
            time.sleep(0.05)
    launch(sleep_forever, 3, sys.argv[1], backend="gloo", timeout=120)
"""


@pytest.mark.slow  # waits on purpose, or on several launches
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("parent_signal", [signal.SIGINT, signal.SIGKILL],
                         ids=["ctrl-c", "parent-killed"])
def test_no_rank_outlives_its_launch(tmp_path, parent_signal):
    script = tmp_path / "sleepers.py"
    script.write_text(textwrap.dedent(SLEEPING_RANKS))
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("[0-9]*"))) < 3:
        assert time.monotonic() < deadline and parent.poll() is None, parent.communicate()[0]
        time.sleep(0.05)
    rank_pids = [int(path.name) for path in tmp_path.glob("[0-9]*")]
    parent.send_signal(parent_signal)
    try:
        output, _ = parent.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        parent.kill()
        pytest.fail(f"the launching process did not end within 10 s of the signal; its output:\n"
                    f"{parent.communicate()[0][-3000:]}")
    if parent_signal == signal.SIGINT:
        assert "KeyboardInterrupt" in output
    assert wait_until_gone(rank_pids, SLACK) == []


TORCHRUN_SCRIPT = """
import torch.distributed as dist
from reference_impl.comm.launcher import launch

def who():
    return dist.get_rank() * 100

results = launch(who, 2, timeout=30)
if dist.get_rank() == 0:
    print("results", results)
"""


@pytest.mark.slow  # a torchrun job
def test_runs_unchanged_under_torchrun(tmp_path):
    script = tmp_path / "under_torchrun.py"
    script.write_text(TORCHRUN_SCRIPT)
    process = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script)], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert process.returncode == 0, process.stdout + process.stderr
    assert "results [0, 100]" in process.stdout


# ----------------------------------------------------------------- code that must not be trusted

class RunsCodeWhenLoaded:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def returns_a_trap(marker):
    return {"fine": torch.ones(2), "trap": RunsCodeWhenLoaded(marker)}


def test_data_results_are_read_without_running_the_sender_s_code(tmp_path):
    marker = str(tmp_path / "ran")
    assert launch(rank_sum, 2, 0, results="data")[1] == (1, 2, 1.0)
    with pytest.raises(RankFailure, match="not data"):
        launch(returns_a_trap, 1, marker, results="data")
    assert not Path(marker).exists()


def starts_a_process_and_prints():
    subprocess.Popen(["sleep", "1000.75"])
    print("y" * 100_000, flush=True)
    return 0


def test_what_a_rank_starts_ends_with_it_and_its_output_is_capped(capfd):
    assert launch(starts_a_process_and_prints, 1, output_limit=100) == [0]
    out = capfd.readouterr().out
    assert "--- output of rank 0 ---" in out and "more bytes of output left out" in out
    assert len(out) < 1000
    time.sleep(0.5)  # SIGKILL is delivered asynchronously
    found = subprocess.run(["pgrep", "-f", "sleep 1000.75"], capture_output=True, text=True)
    assert not found.stdout.split(), "a process the rank started outlived the launch"
