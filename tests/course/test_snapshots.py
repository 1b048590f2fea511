"""The graded checks' snapshots are what the reference gives today, and bad keys are named."""
import pytest
import torch

from reference_impl.course import snapshots


def test_every_stored_snapshot_is_what_its_maker_gives():
    assert snapshots.makers(), "no snapshot makers in reference_impl/course/snapshots/"
    stale = snapshots.out_of_date()
    assert not stale, (f"out of date: {stale}; rewrite with "
                       "`python -m reference_impl.course.snapshots`")


def test_a_missing_key_names_the_keys_there_are():
    lab = snapshots.makers()[0]
    with pytest.raises(KeyError, match="its keys are"):
        snapshots.snapshot(lab, "no such key")


@pytest.mark.parametrize("a, b, equal", [
    (1, 1, True), (1, 1.0, False), ([1, 2], (1, 2), False), ({"x": [1]}, {"x": [1]}, True)])
def test_values_compare_with_their_types(a, b, equal):
    assert snapshots.same(a, b) is equal


def test_another_builds_rounding_is_not_a_stale_snapshot():
    """A GPU build of torch rounds differently: floating-point tensors agree within the graded
    checks' tolerance; integers, shapes and dtypes still exactly."""
    x = torch.linspace(1, 2, 5)
    rounded = x * (1 + 3e-7)
    assert not snapshots.same(x, rounded) and snapshots.same(x, rounded, across_builds=True)
    assert not snapshots.same(x, x + 1e-3, across_builds=True)
    half = x.bfloat16()
    assert snapshots.same(half, half + 0.0078125, across_builds=True)
    assert not snapshots.same(torch.arange(3), torch.arange(3) + 1, across_builds=True)
    assert not snapshots.same(x, x.double(), across_builds=True)


@pytest.mark.parametrize("lab", snapshots.makers())
def test_no_hidden_check_s_value_is_in_the_public_snapshot(lab):
    """The handout ships the public snapshot only: a value the hidden checks read is in the
    hidden one alone (a table of the same name: no row in both). The stored files are read: the
    test above keeps them what the makers give."""
    public, hidden = snapshots.stored_apart(lab)
    for key, value in hidden.items():
        shared = (set(value) & set(public[key]) if isinstance(public.get(key), dict)
                  else {key} & set(public))
        assert not shared, f"{lab}'s public snapshot holds the hidden checks' {key}: {sorted(shared)}"
