"""The expert-parallelism figures: the tokens of the dispatch and the combine where the
all-to-alls put them, the EP and EDP groups coloured as the layout says, the load bars split at
the capacity."""
import pytest
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from reference_impl.figures.experts import (exchange_rows, plot_expert_groups, plot_expert_load,
                                            plot_token_exchange)

DESTINATIONS = [[0, 1, 1], [0, 0], [2, 1, 2, 0]]  # rank r's token t goes to EP rank d


def test_the_dispatch_groups_tokens_by_expert_rank_and_the_combine_brings_them_home():
    rows = exchange_rows(DESTINATIONS)
    assert rows["dispatched"] == [[(0, 0), (1, 0), (1, 1), (2, 3)], [(0, 1), (0, 2), (2, 1)],
                                  [(2, 0), (2, 2)]]
    assert rows["combined"] == rows["tokens"] == [[(0, 0), (0, 1), (0, 2)], [(1, 0), (1, 1)],
                                                  [(2, 0), (2, 1), (2, 2), (2, 3)]]
    figure = plot_token_exchange(DESTINATIONS)
    axes = figure.axes[0]
    boxes = [patch for patch in axes.patches if isinstance(patch, FancyBboxPatch)]
    assert len(boxes) == 3 * 9
    staying = sum(d == r for r, row in enumerate(DESTINATIONS) for d in row)
    arrows = [patch for patch in axes.patches if isinstance(patch, FancyArrowPatch)]
    assert len(arrows) == 2 * (9 - staying)  # only the rows that leave their rank travel
    with pytest.raises(ValueError, match="one of the 3 ranks"):
        exchange_rows([[0, 3], [1], [2]])


@pytest.mark.parametrize("dp, ep", [(8, 4), (8, 2), (4, 4)])
def test_ep_groups_are_rows_and_edp_groups_columns(dp, ep):
    figure = plot_expert_groups(dp, ep, 8)
    ep_axes, edp_axes = figure.axes
    for axes, same in ((ep_axes, lambda a, b: a // ep == b // ep),
                       (edp_axes, lambda a, b: a % ep == b % ep)):
        colours = [patch.get_facecolor() for patch in axes.patches]
        assert len(colours) == dp
        for a in range(dp):
            for b in range(dp):
                assert (colours[a] == colours[b]) == same(a, b), (axes.get_title(), a, b)
    assert f"{dp // ep} group(s) of {ep}" in ep_axes.get_title()
    assert f"{ep} group(s) of {dp // ep}" in edp_axes.get_title()
    assert f"experts {8 // ep}-{2 * (8 // ep) - 1}" in [t.get_text().split("\n")[1]
                                                          for t in ep_axes.texts][1]
    with pytest.raises(ValueError, match="6 experts are not divisible by ep = 4"):
        plot_expert_groups(8, 4, 6)


def test_load_bars_split_at_the_capacity():
    routed, capacity = [5, 1, 3, 7], 4
    figure = plot_expert_load(routed, capacity, ep=2)
    axes = figure.axes[0]
    bars = [patch for patch in axes.patches if isinstance(patch, Rectangle)]
    kept = [bar.get_height() for bar in bars[:4]]
    dropped = [bar.get_height() for bar in bars[4:8]]
    assert kept == [4, 1, 3, 4] and dropped == [1, 0, 0, 3]
    assert [line.get_ydata()[0] for line in axes.lines] == [4.0, 4]  # the mean, the capacity
    assert "per EP rank: [5, 7]" in axes.get_title()
    dropless = plot_expert_load(routed).axes[0]
    assert sum(bar.get_height() for bar in dropless.patches[4:8]) == 0
