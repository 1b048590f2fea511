"""The lecture figures of lab 0 and lab 3: each collective's before/after buffers, the ring
all-reduce one step per figure, and the node topology."""
import pytest

from reference_impl.figures.collective_buffers import COLLECTIVES, collective_states, plot_collective
from reference_impl.figures.ring_all_reduce import plot_ring_step
from reference_impl.figures.node_topology import plot_node_topology


def test_collective_semantics():
    everyone = frozenset(range(4))
    _, after = collective_states("all_reduce")
    assert all(chunk == everyone for row in after for chunk in row)
    _, after = collective_states("reduce_scatter")
    assert [[c for c, chunk in enumerate(row) if chunk] for row in after] == [[0], [1], [2], [3]]
    assert all(after[r][r] == everyone for r in range(4))
    before, after = collective_states("all_gather")
    assert sum(chunk is not None for row in before for chunk in row) == 4
    assert after[3] == [frozenset({c}) for c in range(4)]
    before, after = collective_states("broadcast", root=2)
    assert before[0] == [None] * 4 and after[0] == [frozenset({2})] * 4
    _, after = collective_states("reduce", root=1)
    assert after[1] == [everyone] * 4 and after[0] == [frozenset({0})] * 4
    before, after = collective_states("all_to_all")
    assert after[1][3] == before[3][1] == frozenset({(3, 1)})


@pytest.mark.parametrize("name", COLLECTIVES)
def test_each_collective_is_drawn(name):
    figure = plot_collective(name, n=4)
    left, _, right = figure.axes
    assert len(left.patches) == len(right.patches) == 16


def test_ring_steps_end_with_every_chunk_complete():
    final = plot_ring_step(4, 6).axes[0]
    assert sum(text.get_text() == "Σ" for text in final.texts) == 16
    first = plot_ring_step(4, 1).axes[0]
    assert sum(text.get_text().startswith("chunk") for text in first.texts) == 4
    with pytest.raises(ValueError, match="steps 0..6, got 7"):
        plot_ring_step(4, 7)


def test_topology_names_both_links():
    texts = [t.get_text() for t in plot_node_topology(2, 8, 360, 40).axes[0].texts]
    assert "15" in texts and any("360 GB/s" in t for t in texts)
    assert any("40 GB/s per GPU, 9x less" in t for t in texts)
    with pytest.raises(ValueError, match="gpus_per_node=0"):
        plot_node_topology(2, 0)


def test_unknown_collective_is_named():
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        collective_states("gather")
