"""Is this machine ready to grade the course? One command, before the term:

    python -m reference_impl.course.check_machine [--out machine-check] [--labs 0,1,...]

Reports the GPUs, NCCL, nsys and the sandbox, an all-reduce's bus bandwidth beside lab 0's
alpha-beta fit, each lab's GPUs against those here, every lab's graded tests on the reference,
and the MFU benchmark's line, as ``OUT/machine-check.md`` and ``.json``; without GPUs it runs what
it can and says what it skipped. Details: docs/teaching.md, 'Before the term, on the grading
machine'.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from reference_impl.comm.device import gpu_count
from reference_impl.comm.launcher import launch
from reference_impl.course import sandboxing, syllabus
from reference_impl.course.grade.results import RunEnd, read_log, results_of
from reference_impl.course.plugin_args import plugin_args

REPO = Path(__file__).resolve().parents[2]
SIZES_GPU = [2 ** k for k in range(10, 29, 2)]  # 1 KiB to 256 MiB
SIZES_CPU = [2 ** k for k in range(10, 21, 2)]  # 1 KiB to 1 MiB: gloo on a laptop
TESTS_TIMEOUT = 3600  # seconds one graded run of every lab may take
MFU_TIMEOUT = 900


def machine() -> dict:
    gpus = gpu_count()
    found = {"python": platform.python_version(), "torch": torch.__version__,
             "cuda": torch.version.cuda, "gpus": gpus,
             "gpu names": [torch.cuda.get_device_name(i) for i in range(gpus)],
             "gpu memory GiB": [round(torch.cuda.get_device_properties(i).total_memory / 2 ** 30,
                                      1) for i in range(gpus)],
             "nccl": None, "nsys": shutil.which("nsys"),
             "sandbox": sandboxing.choose("auto")[1],
             "limits": sandboxing.limits(sandboxing.probe() is None)}
    if gpus and dist.is_nccl_available():
        version = torch.cuda.nccl.version()  # a tuple, or an int in older torch
        found["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return found


def _time_all_reduces(sizes: list[int]) -> list[float]:
    from reference_impl.comm.alpha_beta import time_all_reduce
    return time_all_reduce(sizes)


def all_reduce(gpus: int) -> dict:
    """Every GPU's all-reduce over NCCL (two CPU ranks over gloo without GPUs): times, bus
    bandwidths and the alpha-beta fit."""
    from reference_impl.comm.alpha_beta import fit_alpha_beta

    backend, ranks, sizes = ("nccl", gpus, SIZES_GPU) if gpus else ("gloo", 2, SIZES_CPU)
    seconds = launch(_time_all_reduces, ranks, sizes, backend=backend, timeout=600)[0]
    found = {"backend": backend, "ranks": ranks, "bytes": sizes, "seconds": seconds,
             "bus GB/s": [2 * (ranks - 1) / ranks * size / time / 1e9
                          for size, time in zip(sizes, seconds)]}
    if ranks == 1:
        found["note"] = "one GPU: an all-reduce over one rank moves no bytes, so no bandwidth"
        return found
    alpha, bandwidth = fit_alpha_beta(sizes, seconds, ranks)
    if bandwidth > 0:
        found.update({"alpha us": alpha * 1e6, "fitted GB/s": bandwidth / 1e9})
    else:
        found["note"] = ("no alpha-beta fit: the times do not grow with the message size (the "
                         "noise of a busy machine is larger than the transfer time)")
    return found


def lab_needs(gpus: int) -> list[dict]:
    rows = []
    for lab in syllabus.LABS:
        if lab.gpus == 0:
            verdict = "no GPU needed: its checks run in one CPU process"
        elif gpus == 0:
            verdict = "no GPU here: on CPU ranks under --backend auto, skipped under nccl"
        elif gpus >= lab.gpus:
            verdict = "every test on NCCL"
        else:
            verdict = (f"tests of more than {gpus} ranks run on CPU ranks under --backend auto "
                       f"and are skipped under --backend nccl")
        rows.append({"lab": lab.marker, "gpus": lab.gpus, "here": verdict})
    return rows


def graded_tests(labs: list[str], backend: str) -> dict:
    """``pytest -m "<labs>" --backend <backend>`` on the reference, from the kit's root:
    {lab: {"passed": n, "failed": n, "skipped": n}} and the run's last lines."""
    if not (REPO / "tests").is_dir():
        return {"skipped": f"no tests/ folder beside the library ({REPO}): run this from a "
                           "clone of the kit"}
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "grading.jsonl"
        command = [sys.executable, "-m", "pytest", *plugin_args(), "tests/labs", "-m",
                   " or ".join(labs), "--backend", backend, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                   f"--grading-log={log}"]
        process = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                 timeout=TESTS_TIMEOUT)
        end = RunEnd(process.returncode, False, TESTS_TIMEOUT, 0.0, process.stdout[-2000:])
        graded = results_of("reference", labs, read_log(log), end, 0.0)
    counts = {lab: {outcome: 0 for outcome in ("passed", "skipped", "failed")} for lab in labs}
    for test in graded.tests:
        counts[test.lab]["passed" if test.passed else "skipped" if test.skipped else "failed"] += 1
    tail = process.stdout.strip().splitlines()[-1:] if process.stdout.strip() else []
    return {"command": " ".join(["pytest", *command[3:-1]]), "exit code": process.returncode,
            "labs": counts, "summary": tail[0] if tail else process.stderr[-500:]}


def mfu(gpus: int) -> dict:
    command = [sys.executable, "-m", "reference_impl.benchmarks.mfu"]
    if not gpus:
        command += ["--steps", "2", "--warmup", "1"]  # the CPU model, shown working
    process = subprocess.run(command, capture_output=True, text=True, timeout=MFU_TIMEOUT)
    lines = [line for line in process.stdout.splitlines()
             if line.startswith(("device:", "tokens/s:", "MFU:"))]
    return {"command": " ".join(["python", *command[1:]]), "exit code": process.returncode,
            "lines": lines,
            "error": process.stderr[-1000:] if process.returncode else ""}


# ---------------------------------------------------------------- the report

def check(labs: list[str]) -> dict:
    gpus = gpu_count()
    report = {"machine": machine(), "all-reduce": all_reduce(gpus), "labs": lab_needs(gpus),
              "graded tests": {"auto": graded_tests(labs, "auto")}, "skipped": []}
    if gpus:
        report["graded tests"]["nccl"] = graded_tests(labs, "nccl")
    else:
        report["skipped"].append("the graded tests with --backend nccl: no GPU here (every "
                                 "multi-rank test would be skipped)")
        report["skipped"].append("the all-reduce over NCCL: no GPU here, so it ran on two CPU "
                                 "ranks over gloo")
    if sandboxing.probe() is not None:
        report["skipped"].append(f"the sandbox: {sandboxing.probe()}: grade inside a container "
                                 "(docs/grading.md)")
    if not report["machine"]["nsys"]:
        report["skipped"].append("Nsight Systems: `nsys` is not on the PATH (lab 6's GPU "
                                 "timelines need it; its CPU traces do not)")
    report["mfu"] = mfu(gpus)
    return report


def markdown(report: dict) -> str:
    found, reduce = report["machine"], report["all-reduce"]
    gpus = ", ".join(f"{name} ({memory} GiB)" for name, memory in
                     zip(found["gpu names"], found["gpu memory GiB"])) or "none"
    lines = ["# Machine check", "",
             f"- Python {found['python']}, torch {found['torch']}, CUDA {found['cuda']}",
             f"- GPUs: {found['gpus']}: {gpus}",
             f"- NCCL: {found['nccl'] or 'not available'}",
             f"- Nsight Systems: {found['nsys'] or 'not on the PATH'}",
             f"- {found['sandbox'][0].upper()}{found['sandbox'][1:]}", "",
             "## Which limits hold on a graded launch here", "", "| limit | here |", "|---|---|",
             *(f"| {limit} | {here} |" for limit, here in found["limits"].items()), "",
             f"## All-reduce: {reduce['ranks']} ranks over {reduce['backend']}", "",
             "| bytes | time (us) | bus bandwidth (GB/s) |", "|---|---|---|"]
    lines += [f"| {size:,} | {seconds * 1e6:.1f} | {bus:.3g} |" for size, seconds, bus in
              zip(reduce["bytes"], reduce["seconds"], reduce["bus GB/s"])]
    if "alpha us" in reduce:
        lines += ["", f"Alpha-beta fit (lab 0): alpha = {reduce['alpha us']:.1f} us, "
                      f"B = {reduce['fitted GB/s']:.3g} GB/s"]
    else:
        lines += ["", reduce["note"]]
    lines += ["", "## What each lab needs", "", "| lab | GPUs under NCCL | here |", "|---|---|---|"]
    lines += [f"| {row['lab']} | {row['gpus']} | {row['here']} |" for row in report["labs"]]
    for backend, run in report["graded tests"].items():
        lines += ["", f"## Graded tests on the reference, --backend {backend}", ""]
        if "skipped" in run:
            lines.append(f"Skipped: {run['skipped']}")
            continue
        lines += [f"`{run['command']}`: exit code {run['exit code']}, {run['summary']}", "",
                  "| lab | passed | failed | skipped |", "|---|---|---|---|"]
        lines += [f"| {lab} | {n['passed']} | {n['failed']} | {n['skipped']} |"
                  for lab, n in run["labs"].items()]
    run = report["mfu"]
    lines += ["", "## MFU benchmark", "", f"`{run['command']}`: exit code {run['exit code']}", ""]
    lines += [f"    {line}" for line in run["lines"]] + ([f"    {run['error']}"] if run["error"]
                                                         else [])
    lines += ["", "## Skipped", ""] + [f"- {why}" for why in report["skipped"] or ["nothing"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.course.check_machine",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("machine-check"),
                        help="folder for machine-check.md and machine-check.json "
                             "(default machine-check)")
    parser.add_argument("--labs", default=",".join(str(lab.number) for lab in syllabus.LABS),
                        help="the labs whose graded tests to run, e.g. 0,1,2 (default: all)")
    args = parser.parse_args(argv)
    try:
        labs = [syllabus.lab(f"lab{number.strip().removeprefix('lab')}").marker
                for number in args.labs.split(",")]
    except ValueError as error:
        parser.error(f"--labs {args.labs}: {error}")
    report = check(labs)
    text = markdown(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "machine-check.md").write_text(text)
    (args.out / "machine-check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(text)
    print(f"wrote {args.out / 'machine-check.md'} and {args.out / 'machine-check.json'}")
    failed = [run for run in report["graded tests"].values() if run.get("exit code")]
    return 1 if failed or report["mfu"]["exit code"] else 0


if __name__ == "__main__":
    sys.exit(main())
