"""A training run's loss curve: the training loss of every step and the validation loss of
every evaluation, against the step, with a reference line (such as the corpus's unigram
entropy, the loss of a model that ignores context)."""
from __future__ import annotations

from matplotlib.figure import Figure

from reference_impl.figures.style import (BLUE, GREY_53, GRID_ALPHA, NOTEBOOK_FONTSIZE, OPEN_SPINES,
                                          ORANGE, hide_spines, new_figure)


def plot_loss_curve(records: list[dict], title: str = "",
                    reference: tuple[float, str] | None = None) -> Figure:
    """``records``: a run log's (``perf/run_log.py``); ``reference``: (loss, label)."""
    figure = new_figure(6, 3.5)
    axes = figure.add_subplot()
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if train:
        axes.plot(*zip(*train), color=BLUE, linewidth=1, label="training loss")
    if val:
        axes.plot(*zip(*val), color=ORANGE, marker="o", markersize=3, label="validation loss")
    if reference is not None:
        axes.axhline(reference[0], color=GREY_53, linestyle="--", linewidth=1, label=reference[1])
    axes.set_xlabel("step", fontsize=NOTEBOOK_FONTSIZE + 1)
    axes.set_ylabel("loss (nats per token)", fontsize=NOTEBOOK_FONTSIZE + 1)
    axes.tick_params(labelsize=NOTEBOOK_FONTSIZE)
    axes.grid(alpha=GRID_ALPHA)
    hide_spines(axes, OPEN_SPINES)
    if title:
        axes.set_title(title, fontsize=NOTEBOOK_FONTSIZE + 1)
    axes.legend(fontsize=NOTEBOOK_FONTSIZE, frameon=False)
    return figure
