"""The configurations graded checks sweep (``reference_impl/course/sweeps.py``): layouts that
partition the ranks and differ from each other, a draw that covers every value of every axis,
the same for the same seed, another for another."""
import pytest

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
