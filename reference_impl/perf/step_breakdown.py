"""Where a training step's time goes: the device's kernels grouped by what they compute.

    with profile_steps(device) as prof:
        step(); step()
    print(format_breakdown(breakdown(prof, vocab=V, wall_seconds=t, steps=2)))

Each kernel goes in one category (the layers' matmuls, LM head, attention, loss, norms,
activations, optimizer, elementwise) by the operator that launched it or its own name; the gaps
are the wall time when no kernel runs. The categories and a measured step: docs/profiling.md,
'A step near the ceiling'.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass

import torch

from reference_impl.perf.intervals import union_length
from reference_impl.perf.traces import load_trace, native_stderr_silenced

DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # trace categories of a device's work
CATEGORIES = ("matmuls (layers)", "LM head", "attention", "loss", "norms", "activations",
              "optimizer", "elementwise")
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
            "aten::_scaled_mm", "aten::linear")
# (substring of an operator's or a kernel's name, category), the first match wins
NAME_RULES = (
    ("attention", "attention"), ("flash", "attention"), ("fmha", "attention"),
    ("cudnn_sdpa", "attention"), ("softmax", "loss"), ("nll_loss", "loss"),
    ("cross_entropy", "loss"), ("layer_norm", "norms"), ("rms_norm", "norms"),
    ("gelu", "activations"), ("silu", "activations"), ("adam", "optimizer"),
    ("multi_tensor_apply", "optimizer"), ("_foreach_", "optimizer"), ("gemm", "matmuls (layers)"),
    ("nvjet", "matmuls (layers)"), ("xmma", "matmuls (layers)"),
)


def category(op_name: str, kernel_name: str = "", shapes=(), vocab: int | None = None) -> str:
    """The category of a kernel launched by ``op_name`` (an ``aten::`` name, or "" when the
    profiler knows none) with ``shapes`` its operator's input shapes (docs/profiling.md)."""
    if op_name in GEMM_OPS:
        dims = {d for shape in shapes for d in (shape or ())}
        return "LM head" if vocab is not None and vocab in dims else "matmuls (layers)"
    for name in (op_name.lower(), kernel_name.lower()):
        for fragment, found in NAME_RULES:
            if fragment in name:
                return found
    return "elementwise"


@dataclass(frozen=True)
class Breakdown:
    seconds: dict[str, float]  # category -> seconds per step, "gaps" included
    wall_seconds: float        # per step
    overlap_seconds: float     # per step: kernels running at once on several streams

    def fraction(self, name: str) -> float:
        return self.seconds[name] / self.wall_seconds if self.wall_seconds else 0.0


@contextlib.contextmanager
def profile_steps(device: torch.device):
    """A ``torch.profiler`` run recording what :func:`breakdown` reads on ``device`` (the
    operators' input shapes; on a GPU its kernels), without the profiler's log lines."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with native_stderr_silenced(), torch.profiler.profile(activities=activities,
                                                          record_shapes=True) as prof:
        yield prof


def _trace_events(prof) -> list[dict]:
    """The profile's events as its exported Chrome trace holds them (categories ``cpu_op``,
    ``kernel``, ``gpu_memcpy``, ...; a kernel's ``External id`` names the operator that
    launched it)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        return [e for e in load_trace(path).get("traceEvents", []) if e.get("ph") == "X"]


def _self_times(operators: list[dict]) -> list[tuple[dict, float]]:
    """(operator, its own microseconds: its duration less its children's), per thread."""
    result, by_thread = [], {}
    for op in operators:
        by_thread.setdefault((op.get("pid"), op.get("tid")), []).append(op)
    for ops in by_thread.values():
        stack: list[list] = []  # [operator, end, children's time]
        for op in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
            while stack and op["ts"] >= stack[-1][1]:
                done = stack.pop()
                result.append((done[0], done[0]["dur"] - done[2]))
            if stack:
                stack[-1][2] += op["dur"]
            stack.append([op, op["ts"] + op["dur"], 0.0])
        result.extend((done[0], done[0]["dur"] - done[2]) for done in stack)
    return result


def _shapes(op: dict | None) -> list:
    return (op or {}).get("args", {}).get("Input Dims", []) or []


def breakdown(prof, wall_seconds: float, steps: int, vocab: int | None = None) -> Breakdown:
    """Seconds per step in each category of a profile of ``steps`` steps that took
    ``wall_seconds`` in all; ``vocab`` tells the LM head's GEMMs from the layers'."""
    events = _trace_events(prof)
    operators = [e for e in events if e.get("cat") == "cpu_op"]
    kernels = [e for e in events if e.get("cat") in DEVICE_WORK]
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    if kernels:
        launcher = {op.get("args", {}).get("External id"): op for op in operators}
        for kernel in kernels:
            op = launcher.get(kernel.get("args", {}).get("External id"))
            name = op["name"] if op else ""
            seconds[category(name, kernel["name"], _shapes(op), vocab)] += kernel["dur"] * 1e-6
        busy = union_length((k["ts"] * 1e-6, (k["ts"] + k["dur"]) * 1e-6) for k in kernels)
    else:  # the CPU: each operator's own time
        for op, own in _self_times(operators):
            if op["name"].startswith("aten::"):
                seconds[category(op["name"], "", _shapes(op), vocab)] += own * 1e-6
        busy = sum(seconds.values())
    overlap = sum(seconds.values()) - busy
    per_step = {name: value / steps for name, value in seconds.items()}
    per_step["gaps"] = max(wall_seconds - busy, 0.0) / steps
    return Breakdown(per_step, wall_seconds / steps, max(overlap, 0.0) / steps)


def format_breakdown(result: Breakdown, flops_per_step: dict[str, float] | None = None,
                     peak_flops: float | None = None) -> str:
    """The table: ms per step and share of the step per category; with ``flops_per_step``
    (category -> model FLOPs) and ``peak_flops``, each category's fraction of peak too."""
    lines = [f"{'where the time goes':<18} {'ms/step':>9} {'share':>7}"
             + (f" {'of peak':>8}" if flops_per_step else "")]
    for name, value in result.seconds.items():
        line = f"{name:<18} {1e3 * value:>9.2f} {result.fraction(name):>7.1%}"
        flops = (flops_per_step or {}).get(name)
        if flops and peak_flops and value > 0:
            line += f" {flops / value / peak_flops:>8.2f}"
        lines.append(line)
    lines.append(f"{'step (wall)':<18} {1e3 * result.wall_seconds:>9.2f} {1:>7.1%}")
    if result.overlap_seconds > 1e-6:
        lines.append(f"(kernels overlapping on several streams: "
                     f"{1e3 * result.overlap_seconds:.2f} ms/step, counted in their rows)")
    return "\n".join(lines)
