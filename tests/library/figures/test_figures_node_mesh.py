"""The layout-on-nodes figure: a box per GPU and per node, TP groups inside a node with
Megatron's order and across nodes when TP varies slowest, an arrow per pipeline hop."""
import pytest

from reference_impl.comm.groups import build_rank_layout
from reference_impl.figures.node_mesh import groups_inside_nodes, plot_node_mesh


def drawn(axes, gid):
    return [artist for artist in [*axes.patches, *axes.lines] if artist.get_gid() == gid]


@pytest.mark.parametrize("order, inside", [("megatron", 4), ("pp-rdp-tp", 0)])
def test_gpus_nodes_and_links(order, inside):
    layout = build_rank_layout(16, tp=4, pp=2, order=order)
    (axes,) = plot_node_mesh(layout, gpus_per_node=8).axes
    assert len(drawn(axes, "gpu")) == 16
    assert len(drawn(axes, "node")) == 2
    assert len(drawn(axes, "tp-link")) == 4
    assert len(drawn(axes, "pp-link")) == 8  # 8 pipelines of 2 stages: one hop each
    assert groups_inside_nodes(layout, "TP", 8) == inside
    greens = [line for line in drawn(axes, "tp-link") if line.get_color() == "#2ca02c"]
    assert len(greens) == inside
    assert {text.get_text() for text in axes.texts} >= {f"GPU{rank}" for rank in range(16)}


def test_refuses_a_world_that_does_not_fill_nodes():
    with pytest.raises(ValueError, match="12 ranks do not fill nodes of 8 GPUs"):
        plot_node_mesh(build_rank_layout(12, tp=2, pp=2), gpus_per_node=8)
