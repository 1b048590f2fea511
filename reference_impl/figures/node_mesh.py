"""A picture of a rank layout placed on nodes: which groups stay inside a node's fast links.

Global rank r runs on node r // gpus_per_node (how torchrun and SLURM number the processes of
a job: node by node). Each node is a box of GPUs; a GPU's colour is its pipeline stage, its label
its rank and its (tp, rdp) coordinates. A line joins the members of each TP group: green when
the group sits inside one node (NVLink), red when it crosses the network. Arrows join each
pipeline's consecutive stages (activations forward, gradients back). With Megatron-LM's order
(tp fastest) the TP groups are runs of neighbouring ranks, so they stay inside a node: the
rule of the Week 15 notes, "TP degree <= GPUs per node".
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from reference_impl.comm.groups import RankLayout
from reference_impl.figures.style import (GOOD, GREY_33, GREY_50, GREY_95, HIGHLIGHT, SLIDE_FONTSIZE,
                                          STAGE_COLOURS, new_figure)

INSIDE, ACROSS = GOOD, HIGHLIGHT  # a TP group inside one node / across nodes


def node_of(rank: int, gpus_per_node: int) -> int:
    """The node global rank ``rank`` runs on when ranks fill nodes one after the other."""
    return rank // gpus_per_node


def groups_inside_nodes(layout: RankLayout, kind: str, gpus_per_node: int) -> int:
    """How many groups of ``kind`` ("TP", "PP", ...) have all their members on one node."""
    return sum(len({node_of(rank, gpus_per_node) for rank in group}) == 1
               for group in layout.groups[kind])


def plot_node_mesh(layout: RankLayout, gpus_per_node: int, fontsize: float = SLIDE_FONTSIZE) -> Figure:
    """Nodes top to bottom, a node's GPUs left to right; TP groups and pipeline links drawn."""
    if gpus_per_node < 1 or layout.world_size % gpus_per_node:
        raise ValueError(f"{layout.world_size} ranks do not fill nodes of {gpus_per_node} GPUs "
                         f"(world size must be a multiple of gpus_per_node)")
    nodes = layout.world_size // gpus_per_node
    figure = new_figure(10, min(6.5, 1.1 + 1.25 * nodes))
    axes = figure.subplots()
    centre = {rank: (rank % gpus_per_node, -1.6 * node_of(rank, gpus_per_node))
              for rank in range(layout.world_size)}
    for node in range(nodes):
        axes.add_patch(FancyBboxPatch((-0.55, -1.6 * node - 0.6), gpus_per_node + 0.1, 1.2,
                                      boxstyle="round,pad=0.05", facecolor=GREY_95,
                                      edgecolor=GREY_50, zorder=0, gid="node"))
        axes.text(-0.75, -1.6 * node, f"node {node}", ha="right", va="center",
                  fontsize=fontsize)
    for group in layout.groups["TP"]:
        if len(group) > 1:
            inside = len({node_of(rank, gpus_per_node) for rank in group}) == 1
            xs, ys = zip(*(centre[rank] for rank in group))
            axes.plot(xs, [y - 0.42 for y in ys], color=INSIDE if inside else ACROSS,
                      linewidth=4, solid_capstyle="round", zorder=1, gid="tp-link")
    for group in layout.groups["PP"]:
        for first, second in zip(group, group[1:]):
            (x0, y0), (x1, y1) = centre[first], centre[second]
            if y0 == y1:  # same node: an arc over the boxes
                start, end, bend = (x0, y0 + 0.3), (x1, y1 + 0.3), -0.5
            else:
                start, end = (x0, y0 - 0.3), (x1, y1 + 0.3)
                bend = 0.0 if x0 == x1 and abs(y1 - y0) < 2 else 0.25
            axes.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>",
                                           mutation_scale=12, color=GREY_33, linewidth=1,
                                           connectionstyle=f"arc3,rad={bend}", zorder=3,
                                           gid="pp-link"))
    for coords in layout.ranks:
        x, y = centre[coords.rank]
        axes.add_patch(Rectangle((x - 0.38, y - 0.3), 0.76, 0.6, zorder=2, gid="gpu",
                                 facecolor=STAGE_COLOURS[coords.pp_rank % len(STAGE_COLOURS)]))
        axes.text(x, y + 0.08, f"GPU{coords.rank}", ha="center", va="center", color="white",
                  fontsize=fontsize - 1, fontweight="bold", zorder=4)
        axes.text(x, y - 0.16, f"t{coords.tp_rank} d{coords.rdp_rank}", ha="center",
                  va="center", color="white", fontsize=fontsize - 3, zorder=4)
    axes.set_xlim(-2.1, gpus_per_node)
    axes.set_ylim(-1.6 * (nodes - 1) - 0.75, 0.75)
    axes.set_axis_off()
    inside = groups_inside_nodes(layout, "TP", gpus_per_node)
    axes.set_title(
        f"{layout.world_size} GPUs on {nodes} nodes of {gpus_per_node}: tp={layout.tp}, "
        f"pp={layout.pp} (colour: stage; arrows: pipeline), rdp={layout.rdp}; order "
        f"{'-'.join(layout.order)}\nTP groups inside one node (green): {inside} of "
        f"{len(layout.groups['TP'])}; across the network (red): "
        f"{len(layout.groups['TP']) - inside}", fontsize=fontsize, loc="left")
    return figure
