"""The configurations graded checks sweep (``reference_impl/course/sweeps.py``): layouts that
partition the ranks and differ from each other, a draw that covers every value of every axis,
the same for the same seed, another for another."""
import pytest
from hypothesis import given, settings, strategies as st

from reference_impl.course.sweeps import draw, group_layouts, group_of, label


@pytest.mark.parametrize("world, size", [(4, 2), (8, 2), (8, 4), (6, 3), (6, 2)])
def test_layouts_partition_the_ranks_and_differ(world, size):
    layouts = group_layouts(world, size)
    assert set(layouts) == {"consecutive", "strided", "permuted"}
    for groups in layouts.values():
        assert sorted(r for group in groups for r in group) == list(range(world))
        assert all(len(group) == size and group == sorted(group) for group in groups)
    assert len({str(groups) for groups in layouts.values()}) == len(layouts)
    assert layouts["strided"][0] == list(range(0, world, world // size))


def test_one_group_is_the_world_and_a_size_that_does_not_divide_is_refused():
    assert group_layouts(4, 4) == {"world": [[0, 1, 2, 3]]}
    assert group_of(3, group_layouts(4, 2)["strided"]) == [1, 3]
    with pytest.raises(ValueError, match="groups of 3 ranks cannot partition a world of 4"):
        group_layouts(4, 3)


def test_the_draw_covers_every_value_and_is_seeded():
    space = {"cp": [2, 4], "layout": ["consecutive", "strided", "permuted"],
             "dtype": ["fp32", "bf16"]}
    configs = draw(space, seed=0, extra=2)
    for axis, values in space.items():
        assert {config[axis] for config in configs} == set(values)
    assert len(configs) == len({label(c) for c in configs}) >= 3
    assert draw(space, seed=0, extra=2) == configs
    assert any(draw(space, seed=s, extra=2) != configs for s in range(1, 5))
    assert label({"cp": 2, "dtype": "bf16"}, 7) == "seed 7: cp 2, dtype bf16"


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(count=st.integers(1, 6), size=st.integers(1, 6), seed=st.integers(0, 10 ** 6))
def test_any_world_and_seed_gives_partitions_that_differ(count, size, seed):
    """Property-based: whatever the world, group size and seed, each layout partitions the
    ranks into sorted groups of the size, no two layouts are the same grouping, and a world
    split into several groups of several ranks always has its strided layout."""
    world = count * size
    layouts = group_layouts(world, size, seed)
    for groups in layouts.values():
        assert sorted(r for group in groups for r in group) == list(range(world))
        assert all(len(group) == size and group == sorted(group) for group in groups)
    assert len({str(groups) for groups in layouts.values()}) == len(layouts)
    assert ("strided" in layouts) == (count > 1 and size > 1)
    assert ("world" in layouts) == (count == 1)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(space=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]),
                             st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True),
                             min_size=1),
       seed=st.integers(0, 10 ** 6), extra=st.integers(0, 4))
def test_any_space_is_covered_without_repeats(space, seed, extra):
    configs = draw(space, seed, extra)
    for axis, values in space.items():
        assert {config[axis] for config in configs} == set(values)
    assert len(configs) == len({tuple(sorted(c.items())) for c in configs})
    assert draw(space, seed, extra) == configs
