"""Contracts: what an exercise's function promises besides its values, checked on the
student's function against itself (metamorphic testing: Chen, Cheung and Yiu, "Metamorphic
testing: a new approach for generating next test cases", 1998).

A graded test declares, for each unit, the properties its contract promises:

* :class:`ReadsOnly`: the inputs are as they were after the call;
* :class:`FollowsDtype`: floating inputs of another dtype give floating results of that dtype;
* :class:`FollowsDevice`: the results are on the inputs' device (or the one asked for) while
  the default device is another (``meta``, so a CPU machine tells them apart);
* :class:`Relation`: a relation between calls, written in the test as a function
  ``calls(function, args) -> (found, expected)``: invariance or equivariance under reordering
  and renumbering, an optional part absent, the empty and the single case.

One harness applies every property to every draw of inputs: :func:`observe` makes the calls in
the process that holds the student's files (``run_alone``) and returns what it saw as data;
:func:`judged`, in pytest's process, returns one line per broken property naming the unit, the
property and the draw. Public draws are in the lab's graded test, other draws in its hidden
tier. A property states an invariant, never how to keep it.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

ATOL = 1e-6  # results compared between two calls of one function: only the order of sums moves
RTOL = 1e-5


def differs(found: Any, expected: Any, atol: float = ATOL, rtol: float = RTOL) -> str | None:
    """Where ``found`` and ``expected`` differ (tensors within atol + rtol, NaN and inf in
    the same places; sequences and dicts item by item; numbers within the same tolerances),
    or None."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(found, torch.Tensor):
            return f"a {type(found).__name__} where a tensor was expected"
        if found.shape != expected.shape:
            return f"shape {tuple(found.shape)}, expected {tuple(expected.shape)}"
        if found.dtype != expected.dtype:
            return f"dtype {found.dtype}, expected {expected.dtype}"
        found, expected = found.detach().cpu(), expected.detach().cpu()
        if expected.is_floating_point() or expected.is_complex():
            close = torch.isclose(found.double(), expected.double(), rtol=rtol, atol=atol,
                                  equal_nan=True)
        else:
            close = found == expected
        if bool(close.all()):
            return None
        at = tuple(int(i) for i in (~close).nonzero()[0])
        return (f"{int((~close).sum())} of {close.numel()} elements differ, first at {at}: "
                f"{found[at].item()} where {expected[at].item()} was expected")
    if isinstance(expected, dict):
        if not isinstance(found, dict) or set(found) != set(expected):
            return f"{_shown(found)}, expected {_shown(expected)}"
        for key in expected:
            if (where := differs(found[key], expected[key], atol, rtol)) is not None:
                return f"[{key!r}]: {where}"
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(found, (list, tuple)) or len(found) != len(expected):
            return f"{_shown(found)}, expected {_shown(expected)}"
        for index, (one, other) in enumerate(zip(found, expected)):
            if (where := differs(one, other, atol, rtol)) is not None:
                return f"[{index}]: {where}"
        return None
    if isinstance(expected, float) and isinstance(found, (int, float)):
        if math.isclose(found, expected, rel_tol=rtol, abs_tol=atol) or found == expected or \
                (math.isnan(found) and math.isnan(expected)):
            return None
        return f"{found!r}, expected {expected!r}"
    return None if found == expected else f"{_shown(found)}, expected {_shown(expected)}"


def _shown(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _tensors(value: Any):
    """Every tensor inside ``value`` (nested lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for each in value.values():
            yield from _tensors(each)
    elif isinstance(value, (list, tuple)):
        for each in value:
            yield from _tensors(each)


def _mapped(value: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with every tensor inside it replaced by ``change(tensor)``."""
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, dict):
        return {key: _mapped(each, change) for key, each in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mapped(each, change) for each in value)
    return value


def data(value: Any) -> Any:
    """``value`` as plain data (tensors, numbers, strings, None, lists, tuples and dicts of
    them): a dataclass as its fields, a namespace as its attributes, a slice as its three
    numbers, anything else as its text."""
    if value is None or isinstance(value, (torch.Tensor, bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {key: data(each) for key, each in value.items()}
    if isinstance(value, (list, tuple)):
        items = [data(each) for each in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, slice):
        return (value.start, value.stop, value.step)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, SimpleNamespace):
        return data(vars(value))
    return repr(value)


def at_most(found: Any, bound: Any) -> str | None:
    """A comparison for :class:`Relation`: ``found`` is no more than ``bound``."""
    return None if found <= bound + 1e-12 else f"{found!r}, more than {bound!r}"


@dataclass(frozen=True)
class ReadsOnly:
    """The call leaves every input as it found it (the caller's tensors are not written)."""
    name: str = "leaves its inputs as they were"

    def observe(self, function: Callable, args: tuple) -> Any:
        function(*args)
        return args

    def judge(self, seen: Any, args: tuple) -> str | None:
        for index, (now, then) in enumerate(zip(seen, args)):
            if (where := differs(now, then, atol=0, rtol=0)) is not None:
                return f"argument {index + 1} changed: {where}"
        return None


@dataclass(frozen=True)
class FollowsDtype:
    """Floating inputs cast to ``dtype`` give floating results in ``dtype``."""
    dtype: torch.dtype

    @property
    def name(self) -> str:
        return f"gives results in its inputs' dtype ({str(self.dtype).removeprefix('torch.')})"

    def observe(self, function: Callable, args: tuple) -> list[str]:
        cast = _mapped(args, lambda t: t.to(self.dtype) if t.is_floating_point() else t)
        return [str(t.dtype) for t in _tensors(function(*cast)) if t.is_floating_point()]

    def judge(self, seen: list[str], args: tuple) -> str | None:
        wrong = [(index, dtype) for index, dtype in enumerate(seen) if dtype != str(self.dtype)]
        if not wrong:
            return None
        index, dtype = wrong[0]
        return f"floating result tensor {index + 1} is {dtype}"


@dataclass(frozen=True)
class FollowsDevice:
    """The results are on the inputs' device while the default device is another: a tensor
    made inside the call must be placed, or it lands on the default device (on a GPU machine,
    the CPU beside CUDA inputs)."""
    name: str = "gives results on its inputs' device, whatever the default device"
    default: str = "meta"

    def observe(self, function: Callable, args: tuple) -> list[str]:
        with torch.device(self.default):
            result = function(*args)
        return [str(tensor.device) for tensor in _tensors(result)]

    def judge(self, seen: list[str], args: tuple) -> str | None:
        devices = {str(tensor.device) for tensor in _tensors(args)}
        for index, device in enumerate(seen):
            if device not in devices:
                return (f"result tensor {index + 1} is on {device} (the default device in this "
                        f"check), its inputs on {', '.join(sorted(devices))}")
        return None


@dataclass(frozen=True)
class Relation:
    """A relation between calls of the function, declared in the test with the invariant it
    states as its name: ``calls(function, args)`` makes the calls and returns (found,
    expected), which ``compare`` (:func:`differs` unless given) judges. Both are module-level
    functions, so that the contract travels to the helper process."""
    name: str
    calls: Callable[[Callable, tuple], tuple[Any, Any]]
    compare: Callable[[Any, Any], str | None] = differs

    def observe(self, function: Callable, args: tuple) -> tuple[Any, Any]:
        return self.calls(function, args)

    def judge(self, seen: tuple[Any, Any], args: tuple) -> str | None:
        return self.compare(*seen)


Property = ReadsOnly | FollowsDtype | FollowsDevice | Relation


def observe(function: Callable, properties: tuple[Property, ...],
            draws: dict[str, tuple]) -> dict[str, tuple[str, Any]]:
    """In the process that holds the submission: what each property sees on each draw, as
    data, ``("ok", seen)`` or ``("raised", text)``. The function is first called plainly on
    every draw: an exception there (a stub's NotImplementedError with its hint, a refused
    input) is the graded test's to show, as it is."""
    for args in draws.values():
        function(*copy.deepcopy(args))
    observed = {}
    for index, prop in enumerate(properties):
        for label, args in draws.items():
            try:
                observed[f"{index}/{label}"] = ("ok", data(prop.observe(function, copy.deepcopy(args))))
            except NotImplementedError:
                raise
            except Exception as error:  # reported with the property it was checked for
                observed[f"{index}/{label}"] = ("raised", f"{type(error).__name__}: "
                                                          f"{_shown(str(error), 300)}")
    return observed


def judged(unit: str, properties: tuple[Property, ...], draws: dict[str, tuple],
           observed: dict[str, tuple[str, Any]]) -> list[str]:
    """In pytest's process: one line per property of ``unit`` that some draw breaks (the first
    such draw), naming the unit, the property and the draw."""
    failures = []
    for index, prop in enumerate(properties):
        for label, args in draws.items():
            status, seen = observed[f"{index}/{label}"]
            where = f"raised {seen}" if status == "raised" else prop.judge(seen, data(args))
            if where is not None:
                failures.append(f"{unit} breaks its contract that it {prop.name}; on {label}: {where}")
                break
    return failures


def observed_in_helper(impl, module: str, unit: str, properties: tuple[Property, ...],
                       draws: dict[str, tuple]) -> dict:
    """:func:`observe` for ``unit`` of the student's ``module``: given to ``run_alone``."""
    return observe(getattr(impl.module(module), unit), properties, draws)


def assert_contract(run_alone, impl, module: str, unit: str, properties: tuple[Property, ...],
                    draws: dict[str, tuple]) -> None:
    """Fail the graded test with every property of ``unit`` that a draw breaks."""
    failures = judged(unit, properties, draws,
                      run_alone(observed_in_helper, impl, module, unit, properties, draws))
    if failures:
        raise AssertionError("\n".join(failures))
