"""Lab 8, graded: the load-balanced layout of causal context parallelism (``load_balance.py``).

In one helper process, no communication. What is swept: cp = 1 to 8 with 1, 2 and 3 tokens per
chunk (odd chunks included), and two more (cp, tokens per chunk) drawn from cp 9 to 16 and 1 to
3 tokens by the sweep's seed (``--sweep-seed N`` draws others; a failure prints its seed and case):

* **Chunks and positions.** Every rank's two chunks and the global positions of its tokens,
  against the layout's snapshot (``tests/labs/snapshots/lab8.pt``): the sequence cut into 2cp
  equal chunks, two per rank, the earlier first. A sequence that does not
  split into 2cp chunks is refused with a ValueError naming seq and 2cp.
* **What a rank's queries see of another rank's keys.** Every (rank, owner) pair: the (query
  slice, key slice, masked) that ``visible_part`` returns must hold exactly the (query, key)
  pairs with key position <= query position, computed here from the global positions: inside
  the slices every pair, unless ``masked``, and nothing outside them (the positions from the
  snapshot, the causal rule key <= query). ``masked`` is for the
  rank's own block only: ring attention masks with this rank's positions for both queries and
  keys, which is right on its own block alone (of another rank's block, the visible part is
  visible whole).

Everything is exact (integers and booleans): no tolerance.
"""
import random

import pytest
import torch

from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import label

pytestmark = pytest.mark.lab8

FIXED = [(cp, chunk) for cp in range(1, 9) for chunk in (1, 2, 3)]  # (cp, tokens per chunk)
DRAWN = 2  # more (cp, chunk) drawn by the seed from cp 9..16, chunk 1..3
REFUSED = [(2, 10), (4, 20), (3, 9), (8, 24)]  # (cp, seq): seq not divisible by 2cp


def case(cp: int, chunk: int, seed: int, **more) -> str:
    return label({"cp": cp, "seq": 2 * cp * chunk, **more}, seed)


def layouts(seed: int, fixed=FIXED, drawn: int = DRAWN, chunks=(1, 3)) -> list[tuple[int, int]]:
    """``fixed`` and ``drawn`` more (cp, tokens per chunk), cp from 9 to 16, the tokens from
    ``chunks[0]`` to ``chunks[1]``."""
    rng = random.Random(seed)
    return list(fixed) + [(rng.randint(9, 16), rng.randint(*chunks)) for _ in range(drawn)]


def chunks_of(cp: int, rank: int) -> list[int]:
    """Rank ``rank``'s two chunks, from the snapshot."""
    return snapshot("lab8", "chunks")[str(cp)][rank]


def positions_of(seq: int, cp: int, rank: int) -> list[int]:
    """The global positions of rank ``rank``'s tokens, from the snapshot."""
    return snapshot("lab8", "layouts")[f"{cp}/{seq // (2 * cp)}"][rank].tolist()


def layout_alone(impl, part: str, cases: list[tuple[int, int]]):
    """``part`` ("chunks", "positions" or "visible") of every (cp, chunk) case, errors as
    text."""
    balance = impl.module("load_balance")

    def attempt(function, *args):
        try:
            value = function(*args)
        except Exception as error:  # named in the test, with the case
            return f"{type(error).__name__}: {error}"
        if isinstance(value, torch.Tensor):
            return value.tolist()
        return [[each.start, each.stop, each.step] if isinstance(each, slice) else each
                for each in value]

    if part == "chunks":
        return {f"{cp}/{rank}": attempt(balance.chunks_of_rank, cp, rank)
                for cp in sorted({cp for cp, _ in cases}) for rank in range(cp)}
    if part == "positions":
        found = {f"{cp}/{2 * cp * chunk}/{rank}": attempt(balance.token_positions, 2 * cp * chunk, cp, rank)
                 for cp, chunk in cases for rank in range(cp)}
        return {**found, **{f"refused {cp}/{seq}": attempt(balance.token_positions, seq, cp, 0)
                            for cp, seq in REFUSED}}
    return {f"{cp}/{2 * chunk}/{rank}/{owner}": attempt(balance.visible_part, cp, rank, owner, 2 * chunk)
            for cp, chunk in cases for rank in range(cp) for owner in range(cp)}


def raised(value) -> bool:
    return isinstance(value, str)


def check_chunks(impl, run_alone, cases, sweep_seed) -> None:
    found = run_alone(layout_alone, impl, "chunks", cases)
    for cp in sorted({cp for cp, _ in cases}):
        for rank in range(cp):
            actual, expected = found[f"{cp}/{rank}"], list(chunks_of(cp, rank))
            where = f"chunks_of_rank(cp={cp}, rank={rank}) [{label({'cp': cp}, sweep_seed)}]"
            if raised(actual):
                pytest.fail(f"{where} raised {actual}", pytrace=False)
            if actual == [rank, cp - 1 - rank] and actual != expected:
                pytest.fail(f"{where} = {actual}, expected {expected}: the ranks' chunks are all "
                            f"among the first cp = {cp}, but the sequence has 2cp = {2 * cp} chunks",
                            pytrace=False)
            if actual != expected:
                pytest.fail(f"{where} = {actual}, expected {expected}: of the 2cp = {2 * cp} chunks, "
                            "every rank holds one early and one late, the earlier first, and every "
                            "rank has the same causal work", pytrace=False)


def positions_cause(actual, expected, seq: int, cp: int, rank: int) -> str:
    local = seq // cp
    if actual == list(range(local)):
        return ("the positions are local to the rank, not the places of its tokens in the whole "
                "sequence (rotary embeddings and the causal mask need the global ones)")
    if actual == list(range(rank * local, (rank + 1) * local)) and cp > 1:
        return "a contiguous piece of the sequence, not the load-balanced chunks"
    if isinstance(actual, list) and sorted(actual) == sorted(expected):
        return "the right tokens in the wrong order: the earlier chunk comes first"
    size = seq // (2 * cp)
    held = [actual[0] // size, actual[size] // size] if len(actual) == 2 * size else None  # chunks
    if cp > 1 and held == [rank, cp - 1 - rank]:
        return (f"the ranks' chunks are all among the first cp = {cp}, but the sequence has "
                f"2cp = {2 * cp} chunks")
    return (f"the sequence is cut into 2cp = {2 * cp} chunks of {seq // (2 * cp)} tokens; rank "
            f"{rank} holds chunks {chunks_of(cp, rank)}")


def shown(values) -> str:
    """A list of positions, shortened past 24."""
    return str(values) if len(values) <= 24 else f"{values[:12]} ... ({len(values)} positions)"


def check_positions(impl, run_alone, cases, sweep_seed) -> None:
    found = run_alone(layout_alone, impl, "positions", cases)
    for cp, chunk in cases:
        seq = 2 * cp * chunk
        for rank in range(cp):
            actual = found[f"{cp}/{seq}/{rank}"]
            expected = positions_of(seq, cp, rank)
            where = f"token_positions(seq={seq}, cp={cp}, rank={rank}) [{case(cp, chunk, sweep_seed)}]"
            if raised(actual):
                pytest.fail(f"{where} raised {actual}", pytrace=False)
            if actual != expected:
                pytest.fail(f"{where} = {shown(actual)}, expected {shown(expected)}: "
                            f"{positions_cause(actual, expected, seq, cp, rank)}", pytrace=False)
    for cp, seq in REFUSED:
        actual = found[f"refused {cp}/{seq}"]
        if not (raised(actual) and actual.startswith("ValueError") and str(seq) in actual
                and str(2 * cp) in actual):
            pytest.fail(f"token_positions(seq={seq}, cp={cp}, rank=0) gave {shown(actual)}: a "
                        f"sequence that does not split into 2cp = {2 * cp} equal chunks must be "
                        f"refused with a ValueError naming seq {seq} and {2 * cp}", pytrace=False)


def visible_pairs(cp: int, local: int, rank: int, owner: int) -> torch.Tensor:
    """(local, local) booleans: rank's query i sees owner's key j (by global positions)."""
    seq = cp * local
    queries = torch.tensor(positions_of(seq, cp, rank))
    keys = torch.tensor(positions_of(seq, cp, owner))
    return keys[None, :] <= queries[:, None]


def pairs_summary(computed: torch.Tensor, expected: torch.Tensor) -> str:
    """What the computed pairs miss and add, in numbers and a first example (no matrices)."""
    missed, added = expected & ~computed, computed & ~expected
    parts = []
    for name, mask in (("visible pairs left out", missed), ("hidden pairs included", added)):
        if mask.any():
            query, key = (int(i) for i in mask.nonzero()[0])
            parts.append(f"{int(mask.sum())} {name} (the first: query {query}, key {key})")
    return (f"of {int(expected.sum())} visible pairs in {expected.numel()}: "
            + ("; ".join(parts) if parts else "the right pairs"))


def visible_part_cause(cp, rank, owner, local, covered, computed, expected, masked) -> str:
    if owner == rank and not masked:
        return ("the diagonal block was not masked: a rank's own block is causal inside each "
                "chunk (its first chunk does not see its second)")
    if owner != rank and masked:
        return ("masked is True for another rank's block: ring attention masks with this rank's "
                "own positions for queries and keys, right on its own block only; of another "
                "rank's block the visible part is visible whole, with no mask")
    if owner < rank and computed.all():
        return (f"the block from an earlier rank (rank {owner}, r-1 at the first step) was "
                f"treated as fully visible: its second chunk comes after both of rank {rank}'s "
                "chunks")
    if owner > rank and computed[: local // 2].any():
        return (f"rank {rank}'s first chunk sees none of a later rank's keys (chunk {rank} is "
                f"before both of rank {owner}'s chunks); only its second chunk sees them, all of them")
    if (expected & ~covered).any():
        return "pairs that are visible are left out of the slices"
    return "pairs that are hidden (key after query) are inside the unmasked slices"


def check_visible(impl, run_alone, cases, sweep_seed) -> None:
    found = run_alone(layout_alone, impl, "visible", cases)
    for cp, chunk in cases:
        local = 2 * chunk
        for rank in range(cp):
            for owner in range(cp):
                actual = found[f"{cp}/{local}/{rank}/{owner}"]
                where = (f"visible_part(cp={cp}, rank={rank}, owner={owner}, seq_local={local}) "
                         f"[{case(cp, chunk, sweep_seed)}]")
                if raised(actual):
                    pytest.fail(f"{where} raised {actual}", pytrace=False)
                (rows, keys, masked), expected = actual, visible_pairs(cp, local, rank, owner)
                covered = torch.zeros(local, local, dtype=torch.bool)
                covered[slice(*rows), slice(*keys)] = True
                computed = covered & expected if masked else covered
                if bool(masked) == (owner == rank) and torch.equal(computed, expected):
                    continue
                cause = visible_part_cause(cp, rank, owner, local, covered, computed, expected, masked)
                pytest.fail(f"{where} = (rows {rows[:2]}, keys {keys[:2]}, masked {masked}): "
                            f"{pairs_summary(computed, expected)}. {cause}", pytrace=False)


def test_each_rank_holds_two_balanced_chunks(impl, run_alone, sweep_seed):
    check_chunks(impl, run_alone, layouts(sweep_seed), sweep_seed)


def test_token_positions_are_the_places_in_the_whole_sequence(impl, run_alone, sweep_seed):
    check_positions(impl, run_alone, layouts(sweep_seed), sweep_seed)


def test_visible_part_covers_exactly_the_causal_pairs(impl, run_alone, sweep_seed):
    check_visible(impl, run_alone, layouts(sweep_seed), sweep_seed)
