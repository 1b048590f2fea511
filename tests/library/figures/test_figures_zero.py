"""The ZeRO partition figure: one bar per rank per stage, each rank's slices adding up to
zero_memory_formula, and each sharded slice at a different height on every rank."""
import pytest
from matplotlib.patches import Rectangle

from reference_impl.hybrid.zero import zero_memory_formula
from reference_impl.figures.zero_partitions import KINDS, partition_bytes, plot_zero_partitions


def held_slices(axes):
    """The filled boxes (what a rank holds), not the dotted outlines of what it gave away."""
    return [patch for patch in axes.patches
            if isinstance(patch, Rectangle) and patch.get_zorder() == 2]


@pytest.mark.parametrize("world_size, mixed_precision", [(4, True), (3, False)])
def test_each_rank_holds_the_formula(world_size, mixed_precision):
    figure = plot_zero_partitions(world_size, mixed_precision)
    panels = [axes for axes in figure.axes if axes.get_title()]
    assert len(panels) == 4
    for stage, axes in enumerate(panels):
        boxes = held_slices(axes)
        assert len(boxes) == world_size * len(KINDS)
        expected = zero_memory_formula(world_size, world_size, stage, mixed_precision) / world_size
        for rank in range(world_size):
            mine = [box for box in boxes if abs(box.get_x() + 0.4 - rank) < 1e-9]
            assert sum(box.get_height() for box in mine) == pytest.approx(expected)
        assert f"= {expected:.3g} B" in axes.get_title()


def test_sharded_slices_tile_the_whole():
    figure = plot_zero_partitions(4)
    zero_3 = [axes for axes in figure.axes if axes.get_title()][3]
    optimizer = [box for box in held_slices(zero_3) if box.get_label() == "optimizer"]
    starts = sorted(box.get_y() for box in optimizer)
    assert starts == pytest.approx([4, 7, 10, 13])  # 12 bytes cut in 4: rank r holds slice r


def test_partition_bytes_refuses_a_bad_stage():
    assert partition_bytes(8, 2) == {"parameters": 2, "gradients": 0.25, "optimizer": 1.5}
    with pytest.raises(ValueError, match="ZeRO stage must be 0, 1, 2 or 3, got 4"):
        partition_bytes(8, 4)
