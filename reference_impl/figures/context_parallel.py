"""Pictures of context parallelism (lab 8): the ring's steps, the causal mask cut into chunks,
and what the ring and the all-gather variant send and keep per rank.

* :func:`plot_ring_steps`: one column per rank, one row per step; each cell is the K/V block
  the rank holds at that step (rank r holds rank r - t's at step t, Liu et al. 2023's ring),
  in its owner's colour, with the arrow of the send to rank r + 1 that brings it there.
* :func:`plot_causal_chunks`: the causal mask of a sequence cut into 2cp chunks, each visible
  (query, key) pair in the colour of the rank whose query it is: cut contiguously the last rank
  has the most pairs; in the load-balanced layout (``cp/load_balance.py``'s
  ``chunks_of_rank``) every rank has the same number. The panels' titles state the pairs per
  rank (:func:`causal_pairs_per_rank`).
* :func:`plot_cp_traffic`: per cp, the bytes one rank sends (ring and all-gather, forward and
  backward) and the attention's activation bytes it keeps, from ``cp/cp_costs.py``'s formulas.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from reference_impl.cp.cp_costs import (allgather_attention_bytes, attention_activation_bytes,
                                        ring_attention_bytes)
from reference_impl.cp.load_balance import chunks_of_rank
from reference_impl.figures.style import (ALL_SPINES, BLUE_SHADES, GREY_33, GREY_95, OPEN_SPINES,
                                          ORANGE_SHADES, RANK_COLOURS, SLIDE_FONTSIZE, hide_spines,
                                          legend_below, new_figure, swatch)

MIB = 2 ** 20


def ring_holdings(cp: int) -> list[list[int]]:
    """``[step][rank]``: whose K/V block each rank holds at each step of the ring."""
    if cp < 1:
        raise ValueError(f"the ring needs at least one rank, got cp = {cp}")
    return [[(rank - step) % cp for rank in range(cp)] for step in range(cp)]


def plot_ring_steps(cp: int = 4, fontsize: float = SLIDE_FONTSIZE) -> Figure:
    """The K/V block each rank holds at each step, and the sends between the steps."""
    holdings = ring_holdings(cp)
    figure = new_figure(1.6 * cp + 1.5, 1.0 * cp + 1.2)
    axes = figure.subplots()
    for step, row in enumerate(holdings):
        for rank, owner in enumerate(row):
            axes.add_patch(Rectangle((rank - 0.4, step - 0.35), 0.8, 0.7,
                                     facecolor=RANK_COLOURS[owner % len(RANK_COLOURS)],
                                     edgecolor="white", label=f"K/V {owner}"))
            axes.text(rank, step, f"K/V {owner}", ha="center", va="center", color="white",
                      fontsize=fontsize, fontweight="bold")
            if step < cp - 1:  # it travels to the next rank for the next step
                target = (rank + 1) % cp
                end = (target, step + 1 - 0.37) if target else (rank + 0.55, step + 0.75)
                axes.add_patch(FancyArrowPatch((rank + 0.2, step + 0.37), end, arrowstyle="-|>",
                                               mutation_scale=10, color=GREY_33, linewidth=1))
    axes.set_xlim(-0.6, cp - 0.2)
    axes.set_ylim(cp - 0.5, -0.6)
    axes.set_xticks(range(cp), [f"rank {rank}" for rank in range(cp)], fontsize=fontsize)
    axes.set_yticks(range(cp), [f"step {step}" for step in range(cp)], fontsize=fontsize)
    axes.xaxis.tick_top()
    hide_spines(axes, ALL_SPINES)
    axes.tick_params(length=0)
    figure.suptitle("Ring attention: at step t rank r holds rank r - t's K/V block\n"
                    "(computes with it while sending it on to rank r + 1)", fontsize=fontsize)
    return figure


def rank_of_positions(seq: int, cp: int, balanced: bool) -> list[int]:
    """The CP rank holding each position: contiguous pieces, or the load-balanced chunks."""
    if seq % (2 * cp):
        raise ValueError(f"seq {seq} does not split into 2*cp = {2 * cp} chunks")
    chunk = seq // (2 * cp)
    holder = [0] * seq
    for rank in range(cp):
        chunks = chunks_of_rank(cp, rank) if balanced else (2 * rank, 2 * rank + 1)
        for index in chunks:
            holder[index * chunk:(index + 1) * chunk] = [rank] * chunk
    return holder


def causal_pairs_per_rank(seq: int, cp: int, balanced: bool) -> list[int]:
    """The (query, key) pairs with key <= query whose query each rank holds: its causal work."""
    pairs = [0] * cp
    for position, rank in enumerate(rank_of_positions(seq, cp, balanced)):
        pairs[rank] += position + 1
    return pairs


def plot_causal_chunks(cp: int = 2, seq: int = 16, fontsize: float = SLIDE_FONTSIZE) -> Figure:
    """The causal mask coloured by the rank that computes each pair: contiguous, balanced."""
    figure = new_figure(10, 5.4)
    panels = figure.subplots(1, 2)
    chunk = seq // (2 * cp)
    for axes, balanced in zip(panels, (False, True)):
        holder = rank_of_positions(seq, cp, balanced)
        for query in range(seq):
            colour = RANK_COLOURS[holder[query] % len(RANK_COLOURS)]
            for key in range(query + 1):
                axes.add_patch(Rectangle((key, query), 1, 1, facecolor=colour, edgecolor="white",
                                         linewidth=0.5))
        axes.add_patch(Rectangle((0, 0), seq, seq, facecolor=GREY_95, zorder=0))
        for boundary in range(0, seq + 1, chunk):
            axes.axhline(boundary, color=GREY_33, linewidth=0.8)
            axes.axvline(boundary, color=GREY_33, linewidth=0.8)
        pairs = causal_pairs_per_rank(seq, cp, balanced)
        name = "load-balanced chunks" if balanced else "contiguous pieces"
        axes.set_title(f"{name}\npairs per rank: {', '.join(map(str, pairs))}", fontsize=fontsize)
        axes.set_xlim(0, seq)
        axes.set_ylim(seq, 0)
        axes.set_aspect("equal")
        ticks = [index * chunk + chunk / 2 for index in range(2 * cp)]
        labels = [f"c{index}" for index in range(2 * cp)]
        axes.set_xticks(ticks, labels, fontsize=fontsize - 2)
        axes.set_yticks(ticks, labels, fontsize=fontsize - 2)
        axes.set_xlabel("key chunk", fontsize=fontsize - 1)
        axes.set_ylabel("query chunk", fontsize=fontsize - 1)
        axes.tick_params(length=0)
    handles = [swatch(RANK_COLOURS[rank], f"rank {rank}'s queries") for rank in range(cp)]
    legend_below(figure, handles, fontsize - 1)
    figure.suptitle(f"The causal mask of {seq} tokens in 2cp = {2 * cp} chunks, cp = {cp}",
                    fontsize=fontsize + 1)
    return figure


def traffic_per_rank(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, cp: int,
                     element_bytes: int = 2) -> dict[str, float]:
    """MiB one rank sends (ring and all-gather, forward and backward) and keeps (activations)."""
    ring = ring_attention_bytes(batch, kv_heads, seq, head_dim, cp, element_bytes)
    gathered = allgather_attention_bytes(batch, kv_heads, seq, head_dim, cp, element_bytes)
    kept = {variant: attention_activation_bytes(batch, heads, kv_heads, seq, head_dim, cp,
                                                element_bytes, variant)
            for variant in ("ring", "allgather")}
    return {"ring forward": ring["forward"] / MIB, "ring backward": ring["backward"] / MIB,
            "all-gather forward": gathered["forward"] / MIB,
            "all-gather backward": gathered["backward"] / MIB,
            "ring kept": kept["ring"] / MIB, "all-gather kept": kept["allgather"] / MIB}


_SENT = {"ring forward": BLUE_SHADES[0], "ring backward": BLUE_SHADES[1],
         "all-gather forward": ORANGE_SHADES[0], "all-gather backward": ORANGE_SHADES[1]}
_KEPT = {"ring kept": BLUE_SHADES[0], "all-gather kept": ORANGE_SHADES[0]}


def plot_cp_traffic(batch: int = 1, heads: int = 32, kv_heads: int = 8, seq: int = 32768,
                    head_dim: int = 128, cps=(2, 4, 8, 16), element_bytes: int = 2,
                    fontsize: float = SLIDE_FONTSIZE) -> Figure:
    """Per cp: bars of the MiB one rank sends per attention layer, and of what it keeps."""
    figure = new_figure(11, 4.8)
    sent_axes, kept_axes = figure.subplots(1, 2)
    values = {cp: traffic_per_rank(batch, heads, kv_heads, seq, head_dim, cp, element_bytes)
              for cp in cps}
    for axes, kinds in ((sent_axes, _SENT), (kept_axes, _KEPT)):
        width = 0.8 / len(kinds)
        for index, (kind, colour) in enumerate(kinds.items()):
            axes.bar([position + (index - (len(kinds) - 1) / 2) * width for position in range(len(cps))],
                     [values[cp][kind] for cp in cps], width, color=colour, label=kind)
        axes.set_xticks(range(len(cps)), [f"cp = {cp}" for cp in cps], fontsize=fontsize - 2)
        axes.tick_params(axis="y", labelsize=fontsize - 2)
        hide_spines(axes, OPEN_SPINES)
    sent_axes.set_ylabel("MiB sent per rank, one layer", fontsize=fontsize - 1)
    sent_axes.set_title("sent: the same forward, a lighter all-gather backward", fontsize=fontsize)
    kept_axes.set_ylabel("MiB kept for the backward, one layer", fontsize=fontsize - 1)
    kept_axes.set_title("kept: the ring 1/cp, the all-gather the whole K/V", fontsize=fontsize)
    legend_below(figure, [swatch(colour, kind) for kind, colour in _SENT.items()], fontsize - 1)
    figure.suptitle(f"One attention layer, batch {batch}, {seq} tokens, {heads} heads, {kv_heads} KV "
                    f"heads of {head_dim}, {8 * element_bytes}-bit", fontsize=fontsize + 1)
    return figure
