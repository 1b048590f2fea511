"""The reference trainer (``reference_impl/train.py``) and its checkpoints, against single-device
training of the same GPT on the same batches.

* under torchrun on one node (4 CPU ranks, gloo) and on **two nodes on localhost** (two torchrun
  agents meeting through a c10d rendezvous), the losses global rank 0 prints equal
  ``hybrid.train_single_device``'s, and no other rank prints;
* checkpoints: resuming gives the losses of a run that never stopped (same layout: to 1e-6;
  another layout: to 1e-5, fp32 reordering only); a checkpoint loads into a plain ``model.GPT``;
* a layout that does not match the number of processes is refused, with the numbers.
* at GPU speed: a training step (dp 2 x pp 2) reads nothing on the host, calls no barrier and
  times nothing, and returns its loss as a 0-d tensor (the trainer reads it only when it logs);
  ``--attention sdpa`` trains as the explicit single-device GPT does (atol 1e-5); a resume may
  change the kernel; the optimizer is the multi-tensor one (``foreach`` on the CPU). bf16:
  ``tests/library/hybrid/test_bf16.py``.

The single-device run is ``train.train_one_device``: the same AdamW, weight-decay groups,
learning-rate schedule and clipping by the global norm (``test_grad_clipping.py`` checks those
under every layout).

Tolerances (fp32): the parallel runs only reorder additions, so losses and weights agree with
single device to atol 1e-5 (as in ``test_hybrid.py``). AdamW uses eps 1e-4 for the reason given
there (the key bias's gradient is rounding noise).

Every subprocess has a timeout, runs in its own session and is killed with its process group if
anything goes wrong, so no torchrun agent or worker outlives a test.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid

import pytest
import torch

from reference_impl import train
from reference_impl.hybrid import checkpoint, parallel_gpt as hybrid
from reference_impl.hybrid.lr_schedule import set_lr
from reference_impl.checks import assert_close
from reference_impl.model import GPT
from reference_impl.pipeline.pipeline_executor import gpt_loss
from support import REPO

pytestmark = pytest.mark.slow

ATOL = 1e-5
SUBPROCESS_TIMEOUT = 120  # seconds; one torchrun job of 4 CPU ranks takes ~10 s here
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "32",
        "--batch", "8"]
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss (\S+) grad_norm \S+ lr \S+ tokens/s \d+ "
                       r"elapsed \S+s$")


def single_device(argv):
    """The oracle for a trainer command line: losses and final weights of plain training."""
    return train.train_one_device(train.parse_args(argv))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_processes(commands, timeout=SUBPROCESS_TIMEOUT, extra_env=None):
    """Run the commands side by side; return [(returncode, stdout, stderr)]. Each runs in its
    own session; on a timeout or any error every process group is killed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **(extra_env or {})}
    processes = []
    try:
        for command in commands:
            processes.append(subprocess.Popen(command, cwd=REPO, env=env, text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              start_new_session=True))
        results = []
        for process in processes:  # a shared deadline would be tighter; each is bounded
            stdout, stderr = process.communicate(timeout=timeout)
            results.append((process.returncode, stdout, stderr))
        return results
    finally:
        for process in processes:
            if process.poll() is None:
                stop(process)


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (Linux /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    stat = handle.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry))
    return children


def stop(process: subprocess.Popen) -> None:
    """End a torchrun agent and its workers. The agent tears its workers down on SIGTERM; the
    workers run in sessions of their own (torchrun starts them so), so whatever is left of them
    is killed by process group too."""
    workers = _children(process.pid)
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for pid in [process.pid, *workers]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.communicate()


def printed_losses(stdout: str, steps: int) -> list[float]:
    """The losses of the step lines; every line must be one of rank 0's (header, steps, done)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    steps_seen = [STEP_LINE.match(line) for line in lines]
    others = [line for line, match in zip(lines, steps_seen)
              if not match and not line.startswith(("training dp", "done: "))]
    assert not others, f"unexpected output lines (another rank printing?): {others}"
    assert sum(line.startswith("training dp") for line in lines) == 1, stdout
    assert sum(line.startswith("done: ") for line in lines) == 1, stdout
    matches = [m for m in steps_seen if m]
    assert [int(m.group(1)) for m in matches] == list(range(1, steps + 1)), (
        f"expected one line per step from rank 0 only:\n{stdout}")
    return [float(m.group(3)) for m in matches]


def torchrun(*options) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *options]


def test_single_node_torchrun_matches_single_device():
    argv = ["--dp", "2", "--tp", "2", "--pp", "1", "--steps", "3", "--optimizer", "sgd", *TINY]
    [(code, stdout, stderr)] = run_processes(
        [torchrun("--standalone", "--nproc-per-node", "4", "-m", "reference_impl.train", *argv)])
    assert code == 0, stdout + stderr
    expected, _ = single_device(argv)
    assert_close(torch.tensor(printed_losses(stdout, 3)), torch.tensor(expected),
                 "the losses rank 0 printed (torchrun, 2x2x1)", atol=ATOL)


def test_two_nodes_on_localhost_match_single_device():
    argv = ["--dp", "1", "--tp", "2", "--pp", "2", "--steps", "3", "--optimizer", "adamw",
            "--adam-eps", "1e-4", *TINY]
    endpoint, job = f"127.0.0.1:{free_port()}", f"test-train-{uuid.uuid4().hex[:8]}"
    agents = [torchrun("--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node),
                       "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job,
                       # node 0 hosts the rendezvous store (both "nodes" match 127.0.0.1)
                       "--rdzv-conf", f"is_host={int(node == 0)}",
                       "-m", "reference_impl.train", *argv)
              for node in (0, 1)]
    results = run_processes(agents)
    for node, (code, stdout, stderr) in enumerate(results):
        assert code == 0, f"agent of node {node} exited with {code}:\n{stdout}\n{stderr}"
    # The c10d rendezvous, not --node-rank, decides which agent's workers get global ranks
    # 0 and 1; exactly one agent's output must hold rank 0's lines, the other none.
    outputs = [stdout for _, stdout, _ in results]
    assert sum(bool(out.strip()) for out in outputs) == 1, f"both agents printed: {outputs}"
    expected, _ = single_device(argv)
    assert_close(torch.tensor(printed_losses("".join(outputs), 3)), torch.tensor(expected),
                 "the losses global rank 0 printed (2 nodes x 2 ranks, 1x2x2)", atol=ATOL)


# --decay-steps 6: the 3-step runs follow the 6-step run's schedule, so they can resume into it
ADAM = ["--optimizer", "adamw", "--adam-eps", "1e-4", "--lr", "1e-2", "--warmup-steps", "2",
        "--decay-steps", "6", *TINY]


def test_resume_equals_not_stopping_in_any_layout(tmp_path):
    straight = train.main(["--dp", "2", "--tp", "2", "--pp", "1", "--steps", "6", *ADAM])
    expected, _ = single_device(["--steps", "6", *ADAM])
    assert_close(torch.tensor(straight["losses"]), torch.tensor(expected),
                 "6 straight steps (2x2x1) vs single device", atol=ATOL)

    directory = str(tmp_path / "ckpt")
    first = train.main(["--dp", "2", "--tp", "2", "--pp", "1", "--steps", "3", *ADAM,
                        "--checkpoint-dir", directory])
    assert first["losses"] == straight["losses"][:3]
    copy = str(tmp_path / "copy")  # a resumed run saves over its checkpoint at the end
    shutil.copytree(directory, copy)
    same = train.main(["--dp", "2", "--tp", "2", "--pp", "1", "--steps", "6", *ADAM,
                       "--checkpoint-dir", str(tmp_path / "same"), "--resume"])
    assert same["start_step"] == 0, "--resume without a checkpoint starts from step 0"

    resumed = train.main(["--dp", "2", "--tp", "2", "--pp", "1", "--steps", "6", *ADAM,
                          "--checkpoint-dir", directory, "--resume"])
    assert resumed["start_step"] == 3
    assert_close(torch.tensor(resumed["losses"]), torch.tensor(straight["losses"][3:]),
                 "steps 4..6 resumed in the same layout vs not stopping", atol=1e-6, rtol=0,
                 likely_cause="optimizer state, data position or weights not restored")

    # Another layout (1x2x2: two pipeline stages) from the same step-3 checkpoint.
    other = train.main(["--dp", "1", "--tp", "2", "--pp", "2", "--steps", "6", *ADAM,
                        "--checkpoint-dir", copy, "--resume"])
    assert other["start_step"] == 3
    assert_close(torch.tensor(other["losses"]), torch.tensor(straight["losses"][3:]),
                 "steps 4..6 resumed as 1x2x2 from a 2x2x1 checkpoint", atol=ATOL,
                 likely_cause="optimizer state re-sharded for the new layout wrongly")


def test_checkpoint_loads_into_single_device_gpt(tmp_path):
    argv = ["--steps", "3", *ADAM]
    train.main(["--dp", "1", "--tp", "2", "--pp", "2", *argv, "--checkpoint-dir", str(tmp_path)])
    saved, _, saved_optimizer = checkpoint.single_device_state(str(tmp_path))  # no group
    assert saved["step"] == 3
    assert {key: saved["layout"][key] for key in ("dp", "tp", "pp")} == {"dp": 1, "tp": 2, "pp": 2}

    # The same 3 steps on one device, keeping the optimizer to compare its state too.
    args = train.parse_args(argv)
    torch.manual_seed(args.seed)
    reference = GPT(train.model_config(args))
    initial = {name: p.detach().clone() for name, p in reference.named_parameters()}
    optimizer = train.make_optimizer(args, reference.parameters())
    dataset = hybrid.make_dataset(args.seed, 4, args.batch, args.seq, args.vocab)
    for number, (tokens, targets) in enumerate(dataset[:3], start=1):
        optimizer.zero_grad()
        gpt_loss(reference(tokens), targets).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), args.clip_grad)
        set_lr(optimizer, train.schedule(args).lr_at(number))
        optimizer.step()

    loaded = checkpoint.single_device_gpt(str(tmp_path))  # load_state_dict, strict
    for name, parameter in reference.named_parameters():
        assert (parameter - initial[name]).abs().max() > 100 * ATOL, f"{name} barely moved"
        assert_close(loaded.state_dict()[name], parameter.detach(), f"{name} (checkpoint)",
                     atol=ATOL)
        for key in ("exp_avg", "exp_avg_sq"):
            assert_close(saved_optimizer[name][key], optimizer.state[parameter][key],
                         f"Adam {key} of {name} (checkpoint)", atol=ATOL)
        assert saved_optimizer[name]["step"] == 3
    with torch.no_grad():
        assert_close(gpt_loss(loaded(dataset[3][0]), dataset[3][1]),
                     gpt_loss(reference(dataset[3][0]), dataset[3][1]),
                     "the loaded GPT's loss on the next batch", atol=ATOL)


def test_layout_must_match_world_size(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"--dp 2 x --tp 2 x --pp 1 = 4 ranks, but WORLD_SIZE "
                                         r"is 3"):
        train.main(["--dp", "2", "--tp", "2", *TINY])


def test_bad_layout_from_the_command_line():
    [(code, stdout, stderr)] = run_processes(
        [[sys.executable, "-m", "reference_impl.train", "--dp", "2", "--pp", "3", *TINY]],
        extra_env={"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    assert code == 2, stdout + stderr
    assert "error: --dp 2 x --tp 1 x --pp 3 = 6 ranks, but WORLD_SIZE is 4" in stderr
    assert "Traceback" not in stderr


# ---------------------------------------------------------------- the trainer at GPU speed

def _host_reads_during_a_step(argv):
    """On every rank: one ``parallel_gpt.train_step``, counting what would make the host wait
    for a GPU: reading a tensor (``item``, ``tolist``, ``float``), a barrier, the executor's
    ``wait_for_device``. Returns (the count per kind, the loss it returned)."""
    import torch.distributed as dist

    from reference_impl.pipeline import pipeline_executor

    args = train.parse_args(argv)
    context = hybrid.initialize_parallelism(args.dp, args.tp, args.pp)
    torch.manual_seed(args.seed)
    model = hybrid.build_3d_gpt(GPT(train.model_config(args)), context, args.microbatches)
    optimizer = train.make_optimizer(args, model.parameters())
    batch = hybrid.make_dataset(args.seed, 1, args.batch, args.seq, args.vocab)[0]
    counts = {}

    def counted(kind, function):
        def wrapper(*a, **k):
            counts[kind] = counts.get(kind, 0) + 1
            return function(*a, **k)
        return wrapper

    patches = [(torch.Tensor, name) for name in ("item", "tolist", "__float__")]
    patches += [(dist, "barrier"), (pipeline_executor, "wait_for_device")]
    originals = [getattr(owner, name) for owner, name in patches]
    for owner, name in patches:
        setattr(owner, name, counted(name, getattr(owner, name)))
    try:
        loss = hybrid.train_step(model, *batch, optimizer, max_norm=args.clip_grad)
    finally:
        for (owner, name), original in zip(patches, originals):
            setattr(owner, name, original)
    return counts, loss


def test_a_training_step_never_makes_the_host_wait(run_on_ranks):
    """dp 2 x pp 2: ``train_step`` reads nothing on the host and times nothing (the pipeline
    runs untimed), clipping by the global norm included; its loss is a 0-d tensor, read by the
    trainer only when it logs."""
    # SGD: on the CPU, foreach Adam reads its step counters with .item() (CPU tensors; fused
    # Adam on a GPU keeps them there)
    argv = ["--dp", "2", "--pp", "2", "--steps", "1", "--optimizer", "sgd", *TINY]
    expected, _ = single_device(argv)
    for rank, (counts, loss) in enumerate(run_on_ranks(_host_reads_during_a_step, 4, argv)):
        assert counts == {}, f"rank {rank}: the step asked the host {counts}"
        assert torch.is_tensor(loss) and loss.dim() == 0, f"rank {rank}: returned {loss!r}"
        assert_close(loss, expected[0], "the step's loss", rank=rank, atol=ATOL)


def test_sdpa_trainer_matches_explicit_single_device():
    sdpa = train.main(["--dp", "2", "--tp", "2", "--pp", "1", "--steps", "3",
                       "--attention", "sdpa", *ADAM])
    expected, _ = single_device(["--steps", "3", *ADAM])  # the explicit kernel
    assert_close(torch.tensor(sdpa["losses"]), torch.tensor(expected),
                 "--attention sdpa (2x2x1) vs the explicit single-device GPT", atol=ATOL)


def test_resume_may_change_the_attention_kernel():
    args = train.parse_args(["--steps", "6", "--attention", "sdpa", *ADAM])
    saved = {"config": {key: value for key, value in
                        vars(train.model_config(train.parse_args(["--steps", "6", *ADAM])))
                        .items() if key != "attention"},  # as written before the option
             "data": train.data_info(args), "optimizer": train.optimizer_info(args), "step": 3,
             "experts": [0, 0]}
    train._check_resumable(saved, args)  # no error
    saved["config"]["hidden"] = 32
    with pytest.raises(ValueError, match="cannot resume: the checkpoint's config"):
        train._check_resumable(saved, args)


def test_optimizer_updates_all_parameters_at_once():
    args = train.parse_args(["--optimizer", "adamw"])
    parameters = [torch.nn.Parameter(torch.zeros(3))]
    assert train.make_optimizer(args, parameters).defaults["foreach"] is True  # CPU
    args = train.parse_args(["--optimizer", "sgd"])
    assert train.make_optimizer(args, parameters).defaults["foreach"] is True


def test_the_slurm_script_checkpoints_every_data_parallel_kind(tmp_path):
    """``slurm/train_3d.sbatch`` on one node of 2 CPU ranks (``srun`` and ``scontrol`` stand-ins
    on PATH): an FSDP2 run checkpoints, a requeued ZeRO-3 run resumes from it, and the losses
    are single-device training's."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "srun").write_text('#!/bin/bash\nshift\nSLURM_NODEID=0 exec "$@"\n')
    (shims / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {"PATH": f"{shims}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node0",
           "SLURM_NNODES": "1", "SLURM_JOB_ID": uuid.uuid4().hex[:8], "SLURM_JOB_NAME": "t",
           "GPUS_PER_NODE": "2", "PYTHON": sys.executable, "RDZV_PORT": str(free_port()),
           "CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    argv = ["--dp", "2", *ADAM]
    script = str(REPO / "reference_impl" / "slurm" / "train_3d.sbatch")
    printed = []
    for kind, steps in (("fsdp2", "3"), ("zero3", "6")):
        [(code, stdout, stderr)] = run_processes(
            [["bash", script, *argv, "--dp-kind", kind, "--steps", steps]], extra_env=env)
        assert code == 0, f"--dp-kind {kind}:\n{stdout}\n{stderr}"
        printed += [float(m.group(3)) for m in map(STEP_LINE.match, stdout.splitlines()) if m]
    expected, _ = single_device(["--steps", "6", *argv])
    assert_close(torch.tensor(printed), torch.tensor(expected),
                 "the losses of an fsdp2 job (steps 1..3) and a zero3 job resumed from its "
                 "checkpoint (4..6)", atol=ATOL)
