"""What a rank may send back as data: plain values within a budget of bytes, values and depth.

``torch.load(weights_only=True)`` runs no code of the sender's, but it rebuilds any structure
the sender wrote, shared references included: 60 nested pairs of the same list are a few
hundred bytes on the wire and 2**60 values to whatever formats or compares them. The result is
therefore measured as the tree those readers see (a value reached twice counts twice), without
ever walking that tree: each object is visited once and its tree's size is summed from its
children's. A cycle, a type outside plain data, or a tree over a bound is refused, with the
numbers, before anything else looks at the result.
"""
from __future__ import annotations

import torch

# The bounds, generous beside the graded checks' largest result (lab 1's sweep of its units in
# one helper: 621,399 values, 1.3 MB, 11 levels deep), small beside what formatting can take.
MAX_DEPTH = 100  # levels of nesting: recursive formatters (repr, pprint, pytest's diffs) stay
# far from Python's recursion limit (1,000)
MAX_VALUES = 4_000_000  # values in the tree, a shared one counted each time it appears
MAX_BYTES = 256 << 20  # bytes of tensors (as their shape says), strings, bytes and integers
# What a rank may send (torch.save's bytes, read whole before torch.load): the data and room for
# the format's own bytes; a larger message is left unread.
MAX_MESSAGE_BYTES = MAX_BYTES + (64 << 20)


def _no_bytes(_) -> int:
    return 0


def _int_bytes(number: int) -> int:
    return (number.bit_length() + 7) // 8


# The leaves torch.load(weights_only=True) can rebuild (they hold nothing else), by exact type,
# with the bytes each counts.
_LEAF_BYTES = {type(None): _no_bytes, bool: _no_bytes, int: _int_bytes, float: _no_bytes,
               complex: _no_bytes, str: len, bytes: len, bytearray: len, torch.dtype: _no_bytes,
               torch.device: _no_bytes, torch.layout: _no_bytes, torch.memory_format: _no_bytes,
               torch.qscheme: _no_bytes}
_PLAIN = "tensors, numbers, strings, bytes, None, and lists, tuples, sets and dicts of them"


class OverBudget(ValueError):
    """A rank's result is not plain data, or is over one of the bounds."""


def check(value, who: str = "the result") -> tuple[int, int, int]:
    """The (values, bytes, depth) of ``value``'s tree; :class:`OverBudget` unless it is plain
    data within the bounds. ``who`` names it in the error ("rank 1's result")."""
    leaf_bytes = _LEAF_BYTES.get(type(value))
    if leaf_bytes is not None:
        return _within((1, leaf_bytes(value), 1), who)
    measured: dict[int, tuple[int, int, int]] = {}  # id -> (values, bytes, depth) of its tree
    open_ids: set[int] = set()  # the objects on the current path: met again, a cycle
    stack: list = [(value, 1, None)]  # (object, its depth, its children once opened)
    while stack:
        item, depth, children = stack.pop()
        key = id(item)
        if children is not None:
            open_ids.discard(key)
            measured[key] = _within(_measure(item, children, measured), who)
            continue
        if key in measured:
            continue
        if key in open_ids:
            raise OverBudget(f"{who} contains itself (a cycle): not plain data")
        if depth > MAX_DEPTH:
            raise OverBudget(f"{who} is nested more than {MAX_DEPTH:,} levels deep; the limit "
                             f"is {MAX_DEPTH:,}")
        children = _children(item, who)
        if len(children) > MAX_VALUES or len(measured) > MAX_VALUES:
            raise OverBudget(f"{who} holds more than {MAX_VALUES:,} values; the limit is "
                             f"{MAX_VALUES:,}")
        open_ids.add(key)
        stack.append((item, depth, children))
        stack.extend((child, depth + 1, None) for child in children
                     if type(child) not in _LEAF_BYTES)  # a leaf is measured where it is met
    return measured[id(value)]


def _children(item, who: str) -> list:
    if isinstance(item, torch.Tensor):
        return list(vars(item).values())  # attributes torch.load set on it, if any
    if isinstance(item, dict):  # OrderedDict and Counter too
        return [part for pair in item.items() for part in pair]
    if isinstance(item, (list, tuple, set, frozenset)):  # tuple: torch.Size too
        return list(item)
    raise OverBudget(f"{who} holds a {type(item).__module__}.{type(item).__qualname__}: not "
                     f"plain data ({_PLAIN})")


def _measure(item, children: list, measured: dict) -> tuple[int, int, int]:
    """The (values, bytes, depth) of ``item``'s tree, from its children's (measured)."""
    values, depth = 1 + len(children), 2 if children else 1
    size = item.numel() * item.element_size() if isinstance(item, torch.Tensor) else 0
    for child in children:  # a tensor's size is its shape's: an expanded view's too
        leaf_bytes = _LEAF_BYTES.get(type(child))
        if leaf_bytes is not None:
            size += leaf_bytes(child)
            continue
        child_values, child_bytes, child_depth = measured[id(child)]
        values, size = values + child_values - 1, size + child_bytes
        depth = max(depth, child_depth + 1)
    return values, size, depth


def _within(measure: tuple[int, int, int], who: str) -> tuple[int, int, int]:
    values, size, depth = measure
    if values > MAX_VALUES:
        raise OverBudget(f"{who} holds {values:,} values, counting a shared one each time it "
                         f"appears; the limit is {MAX_VALUES:,}")
    if size > MAX_BYTES:
        raise OverBudget(f"{who} holds {size:,} bytes, counting a shared value each time it "
                         f"appears; the limit is {MAX_BYTES:,}")
    if depth > MAX_DEPTH:
        raise OverBudget(f"{who} is nested {depth:,} levels deep; the limit is {MAX_DEPTH:,}")
    return measure
