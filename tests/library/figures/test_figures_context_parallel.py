"""The context-parallelism figures: the ring's cells name the block each rank holds at each
step (rank r - t's), the causal mask's titles state the pairs each rank computes (counted here
from the mask, equal for every rank in the load-balanced layout), and the traffic bars are
cp_costs' formulas."""
import pytest
from matplotlib.patches import Rectangle

from reference_impl.cp.cp_costs import (allgather_attention_bytes, attention_activation_bytes,
                                        ring_attention_bytes)
from reference_impl.figures.context_parallel import (MIB, causal_pairs_per_rank, plot_causal_chunks,
                                                     plot_cp_traffic, plot_ring_steps, ring_holdings)


@pytest.mark.parametrize("cp", [2, 4])
def test_each_cell_is_the_block_of_rank_r_minus_t(cp):
    figure = plot_ring_steps(cp)
    cells = [text for text in figure.axes[0].texts if text.get_text().startswith("K/V")]
    assert len(cells) == cp * cp
    for text in cells:
        rank, step = (round(value) for value in text.get_position())
        assert text.get_text() == f"K/V {(rank - step) % cp}"
    assert ring_holdings(3)[1] == [2, 0, 1]
    with pytest.raises(ValueError, match="at least one rank, got cp = 0"):
        ring_holdings(0)


def pairs_by_colour(axes):
    """Visible (query, key) cells of the mask panel, counted by their colour."""
    counts = {}
    for patch in axes.patches:
        if isinstance(patch, Rectangle) and patch.get_width() == 1:
            counts[patch.get_facecolor()] = counts.get(patch.get_facecolor(), 0) + 1
    return sorted(counts.values())


@pytest.mark.parametrize("cp, seq", [(2, 16), (4, 16)])
def test_the_load_balance_gives_every_rank_the_same_causal_work(cp, seq):
    figure = plot_causal_chunks(cp, seq)
    contiguous, balanced = (axes for axes in figure.axes if axes.get_title())
    brute = {balanced_: [0] * cp for balanced_ in (False, True)}
    chunk = seq // (2 * cp)
    for balanced_ in (False, True):
        for query in range(seq):
            index = query // chunk
            rank = (min(index, 2 * cp - 1 - index) if balanced_ else index // 2)
            brute[balanced_][rank] += query + 1
        assert causal_pairs_per_rank(seq, cp, balanced_) == brute[balanced_]
    assert len(set(brute[True])) == 1 and brute[False][-1] > brute[False][0]
    for axes, balanced_ in ((contiguous, False), (balanced, True)):
        assert f"pairs per rank: {', '.join(map(str, brute[balanced_]))}" in axes.get_title()
        assert pairs_by_colour(axes) == sorted(brute[balanced_])


def test_the_traffic_bars_are_the_formulas():
    cps = (2, 4)
    figure = plot_cp_traffic(batch=1, heads=8, kv_heads=2, seq=64, head_dim=16, cps=cps)
    sent, kept = (axes for axes in figure.axes if axes.get_title())
    heights = [[patch.get_height() for patch in container] for container in sent.containers]
    for column, cp in enumerate(cps):
        ring = ring_attention_bytes(1, 2, 64, 16, cp, 2)
        gathered = allgather_attention_bytes(1, 2, 64, 16, cp, 2)
        expected = [ring["forward"], ring["backward"], gathered["forward"], gathered["backward"]]
        assert [row[column] * MIB for row in heights] == pytest.approx(expected)
        expected_kept = [attention_activation_bytes(1, 8, 2, 64, 16, cp, 2, variant)
                         for variant in ("ring", "allgather")]
        assert [container[column].get_height() * MIB for container in kept.containers] == \
            pytest.approx(expected_kept)
