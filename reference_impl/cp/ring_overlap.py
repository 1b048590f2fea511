"""How much of each ring step's transfer the step's compute hides.

Ring attention (``ring_attention.py``) starts the transfer of the next K/V block, then computes
with the current one, then waits for the transfer. If the transfer takes X and the compute C,
the wait is max(0, X - C): the transfer is hidden whole when X <= C, and otherwise for C of its
X. So, per step, the share of the transfer hidden behind compute is

    hidden = C / (C + wait)        (1 when nothing was waited for)

(the estimate assumes the transfer starts with the compute; it needs no separate measurement
of X). On a GPU the clock is CUDA events on the compute stream: the wait for an NCCL transfer
stalls the stream, not the host, and the events see that stall.
"""
from __future__ import annotations

import time

import torch


class RingClock:
    """Times, per ring step, the compute and the wait for the transfer that ran beside it.

    ring_attention calls :meth:`start`, :meth:`computed`, :meth:`waited` once per step with a
    transfer; read :attr:`steps` ((compute_s, wait_s) per step) or :meth:`hidden_shares`."""

    def __init__(self):
        self._marks: list[tuple] = []  # (start, computed, waited) per step

    def _now(self, device: torch.device):
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self, device: torch.device) -> None:
        self._marks.append([self._now(device)])

    def computed(self, device: torch.device) -> None:
        self._marks[-1].append(self._now(device))

    def waited(self, device: torch.device) -> None:
        self._marks[-1].append(self._now(device))

    @property
    def steps(self) -> list[tuple[float, float]]:
        """(compute seconds, wait seconds) of every timed step."""
        def seconds(begin, end):
            if isinstance(begin, float):
                return end - begin
            end.synchronize()
            return begin.elapsed_time(end) / 1000.0
        return [(seconds(start, computed), seconds(computed, waited))
                for start, computed, waited in self._marks]

    def hidden_shares(self) -> list[float]:
        """Per step, the share of its transfer hidden behind its compute, in [0, 1]."""
        return [compute / (compute + wait) if compute + wait > 0 else 1.0
                for compute, wait in ((c, max(w, 0.0)) for c, w in self.steps)]
