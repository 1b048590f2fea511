"""A rank's communication against what the lab's formula says it must be.

    with CommTracer() as trace:
        layer(x).sum().backward()
    calls = [call.as_data() for call in trace.calls]        # in the rank: plain data
    check_contract(calls, [expected("all_reduce", tp_ranks, 2 * b * s * h)], "the layer",
                   rank=r)                                   # in the test: the verdict

The calls must be exactly the expected ones, as a multiset; the message names the first that
differs and the rank. The rules: docs/grading.md, 'Writing a graded test'.
"""
from __future__ import annotations

from collections import Counter


def expected(op: str, ranks, nbytes: int, peer: int | None = None) -> dict:
    """One operation the formula asks for (the shape of ``CommCall.as_data``)."""
    return {"op": op, "ranks": sorted(int(r) for r in ranks), "nbytes": int(nbytes),
            "peer": None if peer is None else int(peer)}


def describe(call: dict) -> str:
    """'all_reduce of 512 bytes over ranks [0, 2]' (and the peer of a send or receive)."""
    peer = "" if call.get("peer") is None else f" with rank {call['peer']}"
    return f"{call['op']} of {call['nbytes']} bytes over ranks {sorted(call['ranks'])}{peer}"


def _key(call: dict) -> tuple:
    return (call["op"], tuple(sorted(call["ranks"])), call["nbytes"], call.get("peer"))


def contract_violations(calls: list[dict], wanted: list[dict]) -> list[str]:
    """Sentences naming each operation made but not wanted, and each wanted but not made,
    pairing an extra with a missing one of the same kind where there is one."""
    made, asked = Counter(map(_key, calls)), Counter(map(_key, wanted))
    extra = list((made - asked).elements())
    missing = list((asked - made).elements())
    found = []
    for key in extra:
        call = dict(zip(("op", "ranks", "nbytes", "peer"), key))
        twin = next((m for m in missing if m[0] == key[0]), None)
        if twin is None:
            found.append(f"an extra {describe(call)}, which the formula does not ask for")
            continue
        missing.remove(twin)
        asked_for = dict(zip(("op", "ranks", "nbytes", "peer"), twin))
        found.append(f"{describe(call)} where the formula asks for {describe(asked_for)}"
                     f"{_difference(call, asked_for)}")
    for key in missing:
        found.append(f"no {describe(dict(zip(('op', 'ranks', 'nbytes', 'peer'), key)))}, "
                     f"which the formula asks for")
    return found


def _difference(made: dict, asked: dict) -> str:
    """What sets a made operation apart from the one it stands in for."""
    parts = []
    if sorted(made["ranks"]) != sorted(asked["ranks"]):
        parts.append("another group")
    if made["nbytes"] != asked["nbytes"]:
        parts.append(f"{made['nbytes'] / asked['nbytes']:.3g} times the bytes"
                     if asked["nbytes"] else "bytes where none are due")
    if made.get("peer") != asked.get("peer"):
        parts.append("another peer")
    return f" ({', '.join(parts)})" if parts else ""


def check_contract(calls: list[dict], wanted: list[dict], what: str, *, rank: int | None = None,
                   formula: str = "") -> None:
    """Raise AssertionError unless ``calls`` are exactly ``wanted`` (as multisets), naming the
    first operations that differ, the rank and, if given, the formula they come from."""
    found = contract_violations(calls, wanted)
    if not found:
        return
    where = f"{what}" + (f" on rank {rank}" if rank is not None else "")
    shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
    source = f" (the lab's formula: {formula})" if formula else ""
    raise AssertionError(f"{where} communicates other than the formula says{source}: {shown}. "
                         f"Operations made: {len(calls)}; asked for: {len(wanted)}.")
