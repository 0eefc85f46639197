"""What the side stream's copies cost: one record per timed copy, one aggregate per window or epoch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_dataperf import tags

__all__ = ["CopyStats", "CopyTiming"]


@dataclass(frozen=True)
class CopyTiming:
    """One batch's copy on the side stream.

    Attributes:
        copy: seconds the copy took on the side stream.
        bytes: bytes copied.
        exposed: seconds the compute stream waited for the copy and the transform (not hidden behind compute).
        transform: seconds ``device_transform`` took on the side stream after the copy (0 without one).
    """

    copy: float
    bytes: int
    exposed: float
    transform: float = 0.0

    @property
    def hidden_fraction(self) -> float:
        """Share of the side stream's work for this batch (copy and transform) hidden behind compute."""
        busy = self.copy + self.transform
        return 1.0 if busy <= 0 else max(0.0, min(1.0, 1.0 - self.exposed / busy))


@dataclass(frozen=True)
class CopyStats:
    """Means over a set of timed side-stream copies, in seconds per copy.

    Attributes:
        copies: how many timed copies the figures cover.
        copy_s: copy time on the side stream (without the ``device_transform``).
        exposed_s: time the compute stream waited for the copy and the transform.
        transform_s: ``device_transform`` time on the side stream (0 without one).
        hidden_fraction: share of the side stream's work (copy and transform) hidden behind compute.
        gbps: bytes over copy time alone, in GB/s (``None`` when no copy time was measured).

    Example::

        stats = CopyStats.of([CopyTiming(copy=0.002, bytes=100_000_000, exposed=0.0005)])
        stats.gbps, stats.hidden_fraction     # (50.0, 0.75)
        stats.to_metrics()                    # {"Transfer/copy_s": 0.002, ...}
    """

    copies: int
    copy_s: float
    exposed_s: float
    transform_s: float
    hidden_fraction: float
    gbps: float | None

    @classmethod
    def of(cls, copies: Sequence[CopyTiming]) -> CopyStats | None:
        """The aggregate of ``copies``; ``None`` for none."""
        if not copies:
            return None
        count = len(copies)
        copy_time = sum(copy.copy for copy in copies)
        transform_time = sum(copy.transform for copy in copies)
        exposed = sum(copy.exposed for copy in copies)
        busy = copy_time + transform_time
        return cls(
            copies=count,
            copy_s=copy_time / count,
            exposed_s=exposed / count,
            transform_s=transform_time / count,
            hidden_fraction=1.0 if busy <= 0 else max(0.0, 1.0 - exposed / busy),
            # Copy time alone: counting the transform would understate the link's bandwidth.
            gbps=sum(copy.bytes for copy in copies) / copy_time / 1e9 if copy_time > 0 else None,
        )

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        """The ``Transfer/...`` scalars (``Transfer/transform_s`` only when there is a transform)."""
        metrics = {
            f"{prefix}{tags.COPY_S}": self.copy_s,
            f"{prefix}{tags.COPY_EXPOSED_S}": self.exposed_s,
            f"{prefix}{tags.COPY_HIDDEN}": self.hidden_fraction,
        }
        if self.gbps is not None:
            metrics[f"{prefix}{tags.COPY_GBPS}"] = self.gbps
        if self.transform_s > 0:
            metrics[f"{prefix}{tags.COPY_TRANSFORM_S}"] = self.transform_s
        return metrics

    def format(self) -> str:
        text = f"side-stream copy {1e3 * self.copy_s:.2f} ms/batch"
        if self.gbps is not None:
            text += f" at {self.gbps:.1f} GB/s"
        text += f", {100 * self.hidden_fraction:.0f}% hidden behind compute"
        if self.transform_s > 0:
            text += f" (with the device_transform's {1e3 * self.transform_s:.2f} ms)"
        return text
