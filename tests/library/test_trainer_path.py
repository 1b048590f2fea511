"""The trainer's argv path: every call and return between library modules from
``train.main(argv)`` until the rank starts building the model (``train.build_gpt``): parsing,
the plan's checks (once), the launch and the layout. Counted: the modules entered; the
*climbs*, calls into a module of a higher layer (``support/layers.py``: a callback, as
``build_optimizer`` once called back into ``train``); and the *returns up*, returns to a caller
of a higher layer. The bounds are what the code does now: a change that makes the path longer or bouncier
fails here, with the path printed.
"""
import socket
import sys

import torch.distributed as dist

from reference_impl import train
from support.layers import layer_of

MODULES, CLIMBS, RETURNS_UP = 16, 0, 13  # measured


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def argv_path(monkeypatch, argv) -> list[tuple[str, str, str]]:
    """The (from, to) steps between library modules, one rank under a torchrun environment."""
    for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                            TORCHELASTIC_RUN_ID="path").items():
        monkeypatch.setenv(name, value)
    steps, stack, stopped = [], ["reference_impl.train"], []  # steps: (from, to, "call"|"return")

    def follow(frame, event, _):
        module = frame.f_globals.get("__name__", "")
        if stopped or not module.startswith("reference_impl."):
            return
        if event == "call":
            if frame.f_code.co_name == "build_gpt" and module == "reference_impl.train":
                stopped.append(True)
                return
            if module != stack[-1]:
                steps.append((stack[-1], module, "call"))
            stack.append(module)
        elif event == "return":
            stack.pop()
            if stack and stack[-1] != module:
                steps.append((module, stack[-1], "return"))

    sys.setprofile(follow)
    try:
        train.main(argv)  # one step of a tiny model; followed up to build_gpt
    finally:
        sys.setprofile(None)
        if dist.is_initialized():  # the launcher's torchrun rank leaves it to the exit
            dist.destroy_process_group()
    assert stopped, "train.main never called build_gpt"
    return steps


def test_the_argv_path_is_short_and_goes_one_way(monkeypatch):
    steps = argv_path(monkeypatch, ["--steps", "1", "--layers", "2", "--hidden", "16",
                                    "--heads", "2", "--seq", "8", "--vocab", "32"])
    modules = list(dict.fromkeys(module for step in steps for module in step[:2]))
    up = [(kind, layer_of(b) > layer_of(a)) for a, b, kind in steps]
    climbs, returns_up = up.count(("call", True)), up.count(("return", True))
    path = "\n".join(f"  {a} -> {b}" if kind == "call" else f"  {b} <- {a}"
                     for a, b, kind in steps)
    summary = (f"{len(modules)} modules (bound {MODULES}), {climbs} climbs (bound {CLIMBS}), "
               f"{returns_up} returns up (bound {RETURNS_UP})")
    print(f"\n{summary}:\n{path}")
    assert len(modules) <= MODULES and climbs <= CLIMBS and returns_up <= RETURNS_UP, (
        f"the argv path: {summary}\n{path}")
