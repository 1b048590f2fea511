"""Node topology: GPUs inside a node joined by NVLink (through NVSwitch), nodes joined by the
network, with each link's bandwidth per GPU: the picture behind "TP stays inside a node"."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from reference_impl.figures.style import BLUE, DARK_GREEN, GREEN, GREY_20, GREY_96, TEAL, new_figure


def plot_node_topology(nodes: int = 2, gpus_per_node: int = 8, intra_gbs: float = 360.0,
                       inter_gbs: float = 40.0) -> Figure:
    """``nodes`` boxes of ``gpus_per_node`` GPUs on an NVSwitch bar, a network switch below.
    Bandwidths in GB/s per GPU and direction (the defaults: H100's NVLink 4 and one 400 Gb/s
    NIC per GPU as reached in practice, the planner's ``hardware.LINKS``)."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"need at least one node and one GPU, got nodes={nodes}, "
                         f"gpus_per_node={gpus_per_node}")
    figure = new_figure(11, 5.2)
    axes = figure.subplots()
    node_width, gap = gpus_per_node * 0.7 + 0.4, 0.8
    total = nodes * node_width + (nodes - 1) * gap
    axes.set_xlim(-0.2, total + 0.2)
    axes.set_ylim(-2.3, 2.4)
    axes.axis("off")
    network_y = -1.7
    axes.add_patch(FancyBboxPatch((total / 2 - 1.6, network_y - 0.25), 3.2, 0.5,
                                  boxstyle="round,pad=0.05", color=GREEN))
    axes.text(total / 2, network_y, "network switch (InfiniBand)", ha="center", va="center",
              fontsize=14, color="white")
    for node in range(nodes):
        left = node * (node_width + gap)
        axes.add_patch(FancyBboxPatch((left, -0.75), node_width, 2.9, boxstyle="round,pad=0.05",
                                      facecolor=GREY_96, edgecolor=GREY_20, linewidth=1.5))
        axes.text(left + node_width / 2, 1.9, f"node {node}", ha="center", fontsize=15)
        axes.add_patch(FancyBboxPatch((left + 0.2, -0.45), node_width - 0.4, 0.4,
                                      boxstyle="round,pad=0.02", color=TEAL))
        axes.text(left + node_width / 2, -0.25, f"NVSwitch: NVLink {intra_gbs:.0f} GB/s per GPU",
                  ha="center", va="center", fontsize=13)
        for gpu in range(gpus_per_node):
            x = left + 0.4 + gpu * 0.7
            axes.add_patch(FancyBboxPatch((x, 0.55), 0.55, 0.75, boxstyle="round,pad=0.02",
                                          color=BLUE))
            axes.text(x + 0.275, 0.925, str(node * gpus_per_node + gpu), ha="center",
                      va="center", fontsize=12, color="white")
            axes.plot([x + 0.275, x + 0.275], [0.55, -0.05], color=TEAL, linewidth=3)
        axes.plot([left + node_width / 2, total / 2], [-0.8, network_y + 0.27], color=GREEN,
                  linewidth=3)
    axes.text(total / 2, network_y - 0.5,
              f"across nodes: {inter_gbs:.0f} GB/s per GPU, {intra_gbs / inter_gbs:.0f}x less",
              ha="center", va="center", fontsize=14, color=DARK_GREEN)
    return figure
