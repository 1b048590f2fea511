"""Measured all-reduce times against message size, with the fitted alpha-beta line."""
from __future__ import annotations

from matplotlib.figure import Figure

from reference_impl.comm.alpha_beta import ring_all_reduce_seconds
from reference_impl.figures.style import GRID_ALPHA, new_figure


def plot_all_reduce_fit(nbytes: list[float], seconds: list[float], n: int, alpha: float,
                        bandwidth: float) -> Figure:
    """Log-log plot of the measurements and of 2(n-1)*alpha + 2(n-1)/n * S/B."""
    figure = new_figure(6, 4)
    axes = figure.subplots()
    axes.loglog(nbytes, [s * 1e3 for s in seconds], "o", label="measured (median)")
    model = [ring_all_reduce_seconds(size, n, alpha, bandwidth) * 1e3 for size in nbytes]
    axes.loglog(nbytes, model, "-",
                label=f"alpha-beta fit: alpha = {alpha * 1e6:.0f} us, B = {bandwidth / 1e9:.2f} GB/s")
    axes.set_xlabel("message size S (bytes)")
    axes.set_ylabel("all_reduce time (ms)")
    axes.set_title(f"all_reduce on {n} ranks: T = 2(n-1)·alpha + 2(n-1)/n · S/B")
    axes.grid(True, which="both", alpha=GRID_ALPHA)
    axes.legend()
    return figure
