"""The torch-free records of an epoch: :class:`TimingSummary`, :class:`EpochSummary` and :class:`Stall`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_dataperf import tags
from lightning_dataperf.decode.stats import DecodeStats
from lightning_dataperf.loader.stats import LoaderStats
from lightning_dataperf.tags import Stage
from lightning_dataperf.timing.host_gap import HostGapStats
from lightning_dataperf.transfer.stats import CopyStats

__all__ = ["EpochSummary", "Stall", "TimingSummary"]


@dataclass(frozen=True)
class Stall:
    """One long wait for the loader in an otherwise steady epoch: which batch, how long, when."""

    step: int
    wait_s: float
    at_s: float  # seconds into the epoch's steady steps when the wait began (after the epoch start-up)


@dataclass(frozen=True)
class TimingSummary:
    """Distribution of one timing over an epoch, in seconds."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float
    count: int


@dataclass(frozen=True)
class EpochSummary:
    """What one epoch of one stage looked like, reduced over all ranks.

    ``input_stall_fraction`` is device idle / device step time on CUDA, data wait / step time on
    the CPU. ``rank_data_wait`` holds each rank's mean data wait per step; ``slowest_rank`` is the
    rank that waits longest for its loader, and ``straggler_ratio`` the max/min ratio of those waits
    (the min floored at 1 ms so that a rank that never waits does not make the ratio infinite).
    ``loader`` (the loader's inside), ``copies``, ``stalls``, ``host_gap`` and ``decode`` (a GPU-decode loader's
    telemetry) are the figures of rank ``rank`` (:meth:`format` labels them so with several ranks); the rest is
    reduced over all ranks. ``skipped_batches`` (rank ``rank``'s) are batches Lightning skipped (a ``None`` batch,
    or ``training_step`` returned ``None``): not steps, so in neither ``steps`` nor any timing or throughput.
    """

    stage: str
    epoch: int
    steps: int
    timings: dict[str, TimingSummary]
    input_stall_fraction: float | None
    data_wait_share: float | None
    samples_per_sec: float | None
    epoch_start: float | None
    world_size: int = 1
    rank_data_wait: list[float] = field(default_factory=list)
    slowest_rank: int | None = None
    straggler_ratio: float | None = None
    on_device: bool = False
    copies: CopyStats | None = None
    loader: LoaderStats | None = None
    stalls: list[Stall] = field(default_factory=list)
    host_gap: HostGapStats | None = None
    decode: DecodeStats | None = None
    rank: int = 0
    skipped_batches: int = 0

    @property
    def own_data_wait(self) -> float | None:
        """Rank ``rank``'s mean data wait per step (``rank_data_wait``; ``None`` where it was not gathered)."""
        return self.rank_data_wait[self.rank] if 0 <= self.rank < len(self.rank_data_wait) else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> EpochSummary:
        """The inverse of :meth:`to_dict`; keys this version does not know are ignored."""
        known = {name: raw[name] for name in cls.__dataclass_fields__ if name in raw}
        known["timings"] = {name: TimingSummary(**values) for name, values in raw.get("timings", {}).items()}
        if known.get("copies") is not None:
            known["copies"] = CopyStats(**known["copies"])
        if known.get("loader") is not None:
            known["loader"] = LoaderStats(**known["loader"])
        known["stalls"] = [Stall(**stall) for stall in raw.get("stalls", [])]
        if known.get("host_gap") is not None:
            known["host_gap"] = HostGapStats(**known["host_gap"])
        if known.get("decode") is not None:
            known["decode"] = DecodeStats(**known["decode"])
        return cls(**known)

    def to_metrics(self, stage: Stage = Stage.TRAIN) -> dict[str, float]:
        """The epoch's scalars for loggers: ``Time/DataLoading_p90``, ``Time/Compute_p90``, ``Time/EpochStart``.

        On CUDA the step's time on the device is ``Time/DeviceSpan_p90``, and, where the host-gap probe
        measured the epoch, ``Time/Compute`` is the GPU's busy time per step and ``Time/HostGap`` the rest
        of the span. The rest of the distribution (mean, p50, p99, max of every timing), the stall and data-wait
        shares and the throughput are in :meth:`format`, the TensorBoard text and the summaries file;
        the straggler figures are logged with more than one rank only.
        """
        metrics: dict[str, float] = {}
        for name in tags.EPOCH_PERCENTILE_TIMINGS:
            summary = self.timings.get(name)
            if summary is not None:
                metrics[tags.epoch_percentile(name, stage)] = getattr(summary, tags.EPOCH_PERCENTILE)
        optional = {tags.EPOCH_START: self.epoch_start}
        if self.world_size > 1:
            optional[tags.EPOCH_STRAGGLER_RATIO] = self.straggler_ratio
            optional[tags.EPOCH_SLOWEST_RANK] = None if self.slowest_rank is None else float(self.slowest_rank)
        metrics.update({stage.prefix + key: value for key, value in optional.items() if value is not None})
        if self.host_gap is not None:
            metrics[tags.time(tags.COMPUTE, stage)] = self.host_gap.gpu_busy_s
            metrics[tags.time(tags.HOST_GAP, stage)] = self.host_gap.host_gap_s
        return metrics

    def mean_metrics(self, stage: Stage = Stage.TRAIN) -> dict[str, float]:
        """The epoch's means under the tags training logs per window (how evaluation epochs are logged)."""
        metrics = {tags.time(name, stage): timing.mean for name, timing in self.timings.items()}
        if self.samples_per_sec is not None:
            metrics[stage.prefix + tags.SAMPLES_PER_SEC] = self.samples_per_sec
        if self.input_stall_fraction is not None:
            metrics[stage.prefix + tags.INPUT_STALL] = self.input_stall_fraction
        return metrics

    def format(self) -> str:
        """A compact, human-readable table (milliseconds)."""
        where = "device" if self.on_device else "host"
        lines = [f"DataPerf | {self.stage} epoch {self.epoch} | {self.steps} steps | ranks: {self.world_size}"]
        lines.append(f"  {'(ms)':<13}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
        for name, summary in self.timings.items():
            row = [summary.mean, summary.p50, summary.p90, summary.p99, summary.max]
            lines.append(f"  {name:<13}" + "".join(f"{1e3 * value:9.2f}" for value in row))
        facts = []
        if self.epoch_start is not None:
            facts.append(f"epoch start {1e3 * self.epoch_start:.1f} ms")
        if self.input_stall_fraction is not None:
            facts.append(f"input stall {100 * self.input_stall_fraction:.1f}% of {where} step time")
        if self.data_wait_share is not None and self.on_device:
            facts.append(f"host data loading {100 * self.data_wait_share:.1f}%")
        if self.samples_per_sec is not None:
            facts.append(f"{self.samples_per_sec:,.1f} samples/s")
        if facts:
            lines.append("  " + " | ".join(facts))
        if self.skipped_batches:
            lines.append(
                f"  {self.skipped_batches} batch(es) skipped (None batch or training_step returned None): not steps,"
                " left out of every figure"
            )
        own = f"  [rank {self.rank}] " if self.world_size > 1 else "  "  # this rank's own figures, not reduced
        for part in (self.copies, self.loader, self.host_gap, self.decode):
            if part is not None:
                lines.append(own + part.format())
        for stall in self.stalls:
            lines.append(
                f"{own}stall: batch {stall.step} waited {stall.wait_s:.2f} s for the loader, "
                f"{stall.at_s:.1f} s into the epoch (left out of the steady-state figures)"
            )
        if self.straggler_ratio is not None and self.world_size > 1:
            waits = ", ".join(f"{1e3 * wait:.1f}" for wait in self.rank_data_wait)
            lines.append(
                f"  data loading per rank (ms/step): {waits} | slowest rank {self.slowest_rank},"
                f" max/min {self.straggler_ratio:.2f}x"
            )
        return "\n".join(lines)
