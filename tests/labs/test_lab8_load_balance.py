"""Lab 8, graded: the load-balanced layout of causal context parallelism (``load_balance.py``).

In one helper process, no communication:

* **Chunks and positions.** For cp = 1, 2, 3 and 4 and sequences whose chunks have an odd
  number of tokens (seq = 2cp x 3) as well as an even one, every rank's two chunks and the
  global positions of its tokens, against the layout written out here: the sequence cut into
  2cp equal chunks, rank i holding chunks i and 2cp-1-i, in that order. A sequence that does
  not split into 2cp chunks is refused with a ValueError naming seq and 2cp.
* **What a rank's queries see of another rank's keys.** For cp = 2 and 4, every (rank, owner)
  pair: the (query slice, key slice, masked) that ``visible_part`` returns must cover exactly
  the (query, key) pairs with key position <= query position, computed here from the global
  positions: the part inside the slices, causal-masked when ``masked`` says so, and nothing
  outside them.
"""
import pytest
import torch

from reference_impl.toys import head_tail_positions

pytestmark = pytest.mark.lab8

LAYOUTS = [(1, 6), (2, 12), (2, 8), (3, 18), (4, 24), (4, 16)]  # (cp, seq)
REFUSED = [(2, 10), (4, 20), (3, 9)]  # seq not divisible by 2cp
VISIBLE_CASES = [(2, 6), (4, 6), (4, 4)]  # (cp, tokens per rank)


def chunks_written_out(cp: int, rank: int) -> tuple[int, int]:
    return rank, 2 * cp - 1 - rank


def positions_of_chunks(seq: int, cp: int, chunks) -> list[int]:
    size = seq // (2 * cp)
    return [chunk * size + offset for chunk in chunks for offset in range(size)]


positions_written_out = head_tail_positions


def layout_alone(impl, part: str):
    """``part`` ("chunks", "positions" or "visible") of every case, errors as text."""
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
                for cp, _ in LAYOUTS for rank in range(cp)}
    if part == "positions":
        found = {f"{cp}/{seq}/{rank}": attempt(balance.token_positions, seq, cp, rank)
                 for cp, seq in LAYOUTS for rank in range(cp)}
        return {**found, **{f"refused {cp}/{seq}": attempt(balance.token_positions, seq, cp, 0)
                            for cp, seq in REFUSED}}
    return {f"{cp}/{local}/{rank}/{owner}": attempt(balance.visible_part, cp, rank, owner, local)
            for cp, local in VISIBLE_CASES for rank in range(cp) for owner in range(cp)}


def raised(value) -> bool:
    return isinstance(value, str)


def test_each_rank_holds_chunks_i_and_2cp_minus_1_minus_i(impl, run_alone):
    found = {"chunks": run_alone(layout_alone, impl, "chunks")}
    for cp, _ in LAYOUTS:
        for rank in range(cp):
            actual, expected = found["chunks"][f"{cp}/{rank}"], list(chunks_written_out(cp, rank))
            assert not raised(actual), f"chunks_of_rank(cp={cp}, rank={rank}) raised {actual}"
            if actual == [rank, cp - 1 - rank]:
                pytest.fail(f"chunks_of_rank(cp={cp}, rank={rank}) = {actual}: the rank holds chunks "
                            f"i and cp-1-i instead of i and 2cp-1-i (there are 2cp = {2 * cp} "
                            f"chunks; rank i's mirror image is chunk {2 * cp - 1 - rank})")
            assert actual == expected, (
                f"chunks_of_rank(cp={cp}, rank={rank}) = {actual}, expected {expected}: of the "
                f"2cp = {2 * cp} chunks, rank i holds its own index i and its mirror image 2cp-1-i, "
                "one early and one late chunk, so every rank has the same causal work")


def test_token_positions_are_the_places_in_the_whole_sequence(impl, run_alone):
    found = run_alone(layout_alone, impl, "positions")
    for cp, seq in LAYOUTS:
        for rank in range(cp):
            actual = found[f"{cp}/{seq}/{rank}"]
            expected = positions_written_out(seq, cp, rank)
            where = f"token_positions(seq={seq}, cp={cp}, rank={rank})"
            assert not raised(actual), f"{where} raised {actual}"
            if actual == expected:
                continue
            local = seq // cp
            if actual == list(range(local)):
                cause = ("the positions are local to the rank, not the places of its tokens in "
                         "the whole sequence (rotary embeddings and the causal mask need the "
                         "global ones)")
            elif actual == list(range(rank * local, (rank + 1) * local)) and cp > 1:
                cause = ("a contiguous piece of the sequence, not the load-balanced chunks i and "
                         "2cp-1-i")
            elif sorted(actual) == sorted(expected):
                cause = "the right tokens in the wrong order: chunk i first, then chunk 2cp-1-i"
            elif cp > 1 and actual == positions_of_chunks(seq, cp, (rank, cp - 1 - rank)):
                cause = "the rank holds chunks i and cp-1-i instead of i and 2cp-1-i"
            else:
                cause = (f"the sequence is cut into 2cp = {2 * cp} chunks of {seq // (2 * cp)} "
                         f"tokens; rank {rank} holds chunks {chunks_written_out(cp, rank)}")
            pytest.fail(f"{where} = {actual}, expected {expected}: {cause}")
    for cp, seq in REFUSED:
        actual = found[f"refused {cp}/{seq}"]
        assert raised(actual) and actual.startswith("ValueError") and str(seq) in actual \
            and str(2 * cp) in actual, (
                f"token_positions(seq={seq}, cp={cp}, rank=0) gave {actual}: a sequence that "
                f"does not split into 2cp = {2 * cp} equal chunks must be refused with a "
                f"ValueError naming seq {seq} and {2 * cp}")


def visible_pairs(cp: int, local: int, rank: int, owner: int) -> torch.Tensor:
    """(local, local) booleans: rank's query i sees owner's key j (by global positions)."""
    seq = cp * local
    queries = torch.tensor(positions_written_out(seq, cp, rank))
    keys = torch.tensor(positions_written_out(seq, cp, owner))
    return keys[None, :] <= queries[:, None]


def test_visible_part_covers_exactly_the_causal_pairs(impl, run_alone):
    found = run_alone(layout_alone, impl, "visible")
    for cp, local in VISIBLE_CASES:
        for rank in range(cp):
            for owner in range(cp):
                actual = found[f"{cp}/{local}/{rank}/{owner}"]
                where = f"visible_part(cp={cp}, rank={rank}, owner={owner}, seq_local={local})"
                assert not raised(actual), f"{where} raised {actual}"
                (rows, keys, masked), expected = actual, visible_pairs(cp, local, rank, owner)
                covered = torch.zeros(local, local, dtype=torch.bool)
                covered[slice(*rows), slice(*keys)] = True
                computed = covered & expected if masked else covered
                if torch.equal(computed, expected):
                    continue
                if owner == rank:
                    cause = ("the diagonal block was not masked: a rank's own block is causal "
                             "inside each chunk (its first chunk does not see its second)")
                elif owner < rank and computed.all():
                    cause = (f"the block from an earlier rank (rank {owner}, r-1 at the first "
                             "step) was treated as fully visible: its second chunk "
                             f"{2 * cp - 1 - owner} comes after both of rank {rank}'s chunks")
                elif owner > rank and computed[: local // 2].any():
                    cause = (f"rank {rank}'s first chunk sees none of a later rank's keys (chunk "
                             f"{rank} is before both of rank {owner}'s chunks); only its second "
                             "chunk sees them, all of them")
                elif (expected & ~covered).any():
                    cause = "pairs that are visible are left out of the slices"
                else:
                    cause = "pairs that are hidden (key after query) are inside the unmasked slices"
                pytest.fail(f"{where} = (rows {rows[:2]}, keys {keys[:2]}, masked {masked}) gives "
                            f"the pairs\n{computed.int()}\nexpected (key position <= query "
                            f"position)\n{expected.int()}\n{cause}")
