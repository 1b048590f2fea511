"""The trainer's argv path: every call and return between library modules from
``train.main(argv)`` until the rank starts building the model (``train.build_gpt``): parsing,
the plan's checks (once), the launch and the layout. Counted: the modules entered, the *climbs*
(a step to a module of a higher layer, ``support/layers.py``: a return to a caller above, or
a callback) and the *returns* to a module already left. The bounds are what the code does
now: a change that makes the path longer or bouncier fails here, with the path printed.
"""
import socket
import sys

from reference_impl import train
from support.layers import layer_of

MODULES, CLIMBS = 16, 13  # measured: 16 modules, 13 climbs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def argv_path(monkeypatch, argv) -> list[tuple[str, str]]:
    """The (from, to) steps between library modules, one rank under a torchrun environment."""
    for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                            TORCHELASTIC_RUN_ID="path").items():
        monkeypatch.setenv(name, value)
    steps, stack, stopped = [], ["reference_impl.train"], []

    def follow(frame, event, _):
        module = frame.f_globals.get("__name__", "")
        if stopped or not module.startswith("reference_impl."):
            return
        if event == "call":
            if frame.f_code.co_name == "build_gpt" and module == "reference_impl.train":
                stopped.append(True)
                return
            if module != stack[-1]:
                steps.append((stack[-1], module))
            stack.append(module)
        elif event == "return":
            stack.pop()
            if stack and stack[-1] != module:
                steps.append((module, stack[-1]))

    sys.setprofile(follow)
    try:
        train.main(argv)  # one step of a tiny model; followed up to build_gpt
    finally:
        sys.setprofile(None)
    assert stopped, "train.main never called build_gpt"
    return steps


def test_the_argv_path_is_short_and_goes_one_way(monkeypatch):
    steps = argv_path(monkeypatch, ["--steps", "1", "--layers", "2", "--hidden", "16",
                                    "--heads", "2", "--seq", "8", "--vocab", "32"])
    modules = list(dict.fromkeys(module for step in steps for module in step))
    climbs = [step for step in steps if layer_of(step[1]) > layer_of(step[0])]
    path = "\n".join(f"  {a} -> {b}" for a, b in steps)
    print(f"\n{len(modules)} modules, {len(climbs)} climbs:\n{path}")
    assert len(modules) <= MODULES and len(climbs) <= CLIMBS, (
        f"the argv path enters {len(modules)} modules (bound {MODULES}) and climbs "
        f"{len(climbs)} times (bound {CLIMBS}):\n{path}")
