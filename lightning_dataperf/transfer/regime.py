"""When the side stream pays: from whether the GPU was idle each time the host handed over a batch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CopyRegime"]


@dataclass
class CopyRegime:
    """Chooses between the side stream and the stock copy (``non_blocking`` on the compute stream), per window.

    A compute stream found idle when the host hands over the next batch means the host sets the pace: a copy
    queued on the compute stream then runs in GPU time the step does not use, while the side stream's events,
    stream switches and ``record_stream`` cost host time on every step. So after a window in which the stream
    was idle at ``to_stock`` of the hand-overs or more, copies go the stock way; once it is idle at fewer than
    ``to_side`` of them (the copy now delays the step), they go back, and the next window is twice as long.
    Fed by :class:`~lightning_dataperf.transfer.copier.SideStreamCopier` (``torch.cuda.Stream.query()``, which
    never waits).

    Example::

        regime = CopyRegime()
        stock = regime.observe(compute_idle=torch.cuda.current_stream().query())
    """

    window: int = 32
    to_stock: float = 0.9
    to_side: float = 0.5
    stock: bool = False
    switches: int = 0
    stock_batches: int = 0
    side_batches: int = 0
    _idle: int = 0
    _seen: int = 0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window={self.window} must be at least 1 hand-over")
        if not 0.0 <= self.to_side < self.to_stock <= 1.0:
            raise ValueError(
                f"to_side={self.to_side}, to_stock={self.to_stock}: need 0 <= to_side < to_stock <= 1 (a gap between "
                "the two thresholds keeps a run on the edge from switching every window)"
            )

    def observe(self, compute_idle: bool) -> bool:
        """Record one hand-over; ``True``: copy this batch the stock way."""
        self._seen += 1
        self._idle += bool(compute_idle)
        if self._seen >= self.window:
            share = self._idle / self._seen
            # Two thresholds with a gap between them, so that a run on the edge does not switch every window.
            if not self.stock and share >= self.to_stock:
                self.stock = True
                self.switches += 1
            elif self.stock and share < self.to_side:
                self.stock = False
                self.switches += 1
                # a run on the edge between the regimes: look longer before leaving the side stream again
                self.window *= 2
            self._idle = self._seen = 0
        if self.stock:
            self.stock_batches += 1
        else:
            self.side_batches += 1
        return self.stock

    def describe(self) -> str:
        """One line for the console: which copy the batches took, and why."""
        total = self.stock_batches + self.side_batches
        if not self.stock_batches:
            return f"side stream for all {total} large batches"
        return (
            f"stock copy for {self.stock_batches} of {total} large batches: the GPU was idle when the host handed "
            "over the next batch (host-bound), so the side stream had nothing to hide"
        )
