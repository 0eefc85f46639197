"""Aggregation of :class:`~lightning_dataperf.timing.StepTiming` records.

Two views: :func:`window_metrics` turns the steps since the last log point into means and maxima
for the loggers; :class:`EpochAccumulator` keeps every steady-state value of an epoch in torchmetrics
``CatMetric`` states, so the epoch summary (mean, p50, p90, p99, max) is reduced across DDP ranks.

Example::

    accumulator = EpochAccumulator()
    accumulator.update(clock.completed())
    summary = accumulator.summarize(stage="train", epoch=0, device=torch.device("cpu"))
    print(summary.format())
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torchmetrics.aggregation import CatMetric

from lightning_dataperf import tags
from lightning_dataperf.copy_stats import CopyStats
from lightning_dataperf.decode_stats import DecodeStats
from lightning_dataperf.host_gap import HostGapStats
from lightning_dataperf.loader_stats import LoaderStats
from lightning_dataperf.tags import Stage
from lightning_dataperf.timing import StepTiming

__all__ = ["TIMINGS", "EpochAccumulator", "EpochSummary", "Stall", "TimingSummary", "find_stalls", "window_metrics"]

#: Logged name -> StepTiming attribute. Data wait, step time and device idle of an epoch's first step
#: are start-up cost, reported as ``Time/EpochStart`` and kept out of these.
TIMINGS: dict[str, str] = {
    tags.DATA_LOADING: "data_wait",
    tags.TRANSFER: "transfer",
    tags.COMPUTE: "host_compute",  # CPU; on CUDA Time/Compute is the GPU's busy time, from the host-gap probe
    tags.DEVICE_SPAN: "device_span",
    tags.STEP: "step_time",
    tags.DEVICE_IDLE: "device_idle",
}
_STARTUP_FIELDS = {"data_wait", "step_time", "device_idle", "device_step_time"}
_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def steady_values(timings: Iterable[StepTiming], attribute: str) -> list[float]:
    """The values of one attribute, leaving out ``None`` and epoch start-up values."""
    values = []
    for timing in timings:
        if timing.first_of_epoch and attribute in _STARTUP_FIELDS:
            continue
        value = getattr(timing, attribute)
        if value is not None:
            values.append(float(value))
    return values


def stall_totals(timings: Iterable[StepTiming]) -> tuple[float, float]:
    """(time lost to input, step time it is a share of), summed over steady-state steps."""
    lost = base = 0.0
    for timing in timings:
        if timing.first_of_epoch or timing.input_stall is None or timing.stall_base is None:
            continue
        lost += timing.input_stall
        base += timing.stall_base
    return lost, base


#: A step whose data wait exceeds the epoch's median by this much (and by STALL_FACTOR times) is a stall...
STALL_MIN_S, STALL_FACTOR = 0.25, 10.0
#: ... as long as such steps are rare (at most this share of the steps, or two); otherwise they are the steady state.
STALL_MAX_SHARE = 0.05


@dataclass(frozen=True)
class Stall:
    """One long wait for the loader in an otherwise steady epoch: which batch, how long, when."""

    step: int
    wait_s: float
    at_s: float  # seconds into the epoch's steady steps when the wait began (after the epoch start-up)


def find_stalls(timings: Sequence[StepTiming]) -> list[Stall]:
    """The rare steps whose data wait is far above the epoch's median (robust: one stall, not a trend)."""
    steady = [timing for timing in timings if not timing.first_of_epoch]
    if len(steady) < 5:
        return []
    waits = sorted(timing.data_wait for timing in steady)
    median = waits[len(waits) // 2]
    threshold = median + max(STALL_MIN_S, STALL_FACTOR * median)
    stalls, elapsed = [], 0.0
    for timing in steady:
        if timing.data_wait > threshold:
            stalls.append(Stall(timing.step, timing.data_wait, elapsed))
        elapsed += timing.step_time or (timing.data_wait + timing.compute)
    return stalls if len(stalls) <= max(2, STALL_MAX_SHARE * len(steady)) else []


def throughput_totals(timings: Iterable[StepTiming]) -> tuple[int, float]:
    """(samples, seconds) over steady-state steps whose size and step time are known."""
    samples, seconds = 0, 0.0
    for timing in timings:
        if timing.first_of_epoch or timing.samples is None or timing.step_time is None:
            continue
        samples += timing.samples
        seconds += timing.step_time
    return samples, seconds


def window_metrics(timings: Sequence[StepTiming], stage: Stage = Stage.TRAIN) -> dict[str, float]:
    """Mean (and max) of each timing over ``timings``, plus throughput and input-stall fraction."""
    metrics: dict[str, float] = {}
    for name, attribute in TIMINGS.items():
        values = steady_values(timings, attribute)
        if values:
            metrics[tags.time(name, stage)] = sum(values) / len(values)
            metrics[tags.time(name, stage) + "_max"] = max(values)
    samples, seconds = throughput_totals(timings)
    if seconds > 0:
        metrics[stage.prefix + tags.SAMPLES_PER_SEC] = samples / seconds
    lost, base = stall_totals(timings)
    if base > 0:
        metrics[stage.prefix + tags.INPUT_STALL] = min(1.0, lost / base)
    return metrics


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
    ``loader`` (the loader's inside), ``stalls``, ``host_gap`` and ``decode`` (a GPU-decode loader's
    telemetry) are this rank's own; the rest is reduced over all ranks.
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
            facts.append(f"host data wait {100 * self.data_wait_share:.1f}%")
        if self.samples_per_sec is not None:
            facts.append(f"{self.samples_per_sec:,.1f} samples/s")
        if facts:
            lines.append("  " + " | ".join(facts))
        if self.copies is not None:
            lines.append("  " + self.copies.format())
        if self.loader is not None:
            lines.append("  " + self.loader.format())
        if self.host_gap is not None:
            lines.append("  " + self.host_gap.format())
        if self.decode is not None:
            lines.append("  " + self.decode.format())
        for stall in self.stalls:
            lines.append(
                f"  stall: batch {stall.step} waited {stall.wait_s:.2f} s for the loader, "
                f"{stall.at_s:.1f} s into the epoch (left out of the steady-state figures)"
            )
        if self.straggler_ratio is not None and self.world_size > 1:
            waits = ", ".join(f"{1e3 * wait:.1f}" for wait in self.rank_data_wait)
            lines.append(
                f"  data wait per rank (ms/step): {waits} | slowest rank {self.slowest_rank},"
                f" max/min {self.straggler_ratio:.2f}x"
            )
        return "\n".join(lines)


def _quantiles(values: torch.Tensor) -> TimingSummary:
    values = values[~torch.isnan(values)].double()
    if values.numel() == 0:
        nan = math.nan
        return TimingSummary(nan, nan, nan, nan, nan, 0)
    quantiles = torch.quantile(values, torch.tensor(list(_QUANTILES.values()), dtype=values.dtype))
    return TimingSummary(
        mean=values.mean().item(),
        p50=quantiles[0].item(),
        p90=quantiles[1].item(),
        p99=quantiles[2].item(),
        max=values.max().item(),
        count=values.numel(),
    )


AllGather = Callable[[torch.Tensor], torch.Tensor]


class EpochAccumulator:
    """Collects one epoch of step timings and reduces them across ranks at the end.

    Every rank must call :meth:`summarize` (it is a collective under DDP).
    """

    def __init__(self) -> None:
        self._values = {name: CatMetric(nan_strategy="disable") for name in TIMINGS}
        self.reset()

    def reset(self) -> None:
        for metric in self._values.values():
            metric.reset()
        self._timings: list[StepTiming] = []
        self.steps = 0
        self.epoch_start: float | None = None

    def update(self, timings: Sequence[StepTiming]) -> None:
        """Keep the records; all arithmetic happens once, in :meth:`summarize` (cheap per step)."""
        self._timings.extend(timings)
        self.steps += len(timings)

    def _totals(self, stalls: list[Stall]) -> list[float]:
        stalled = {stall.step for stall in stalls}
        timings = [timing for timing in self._timings if timing.step not in stalled]
        lost, base = stall_totals(timings)
        samples, seconds = throughput_totals(timings)
        wait = sum(steady_values(timings, "data_wait"))
        wall = sum(steady_values(timings, "step_time"))
        epoch_start = math.nan if self.epoch_start is None else self.epoch_start
        return [lost, base, wait, wall, float(samples), seconds, float(self.steps), epoch_start]

    def summarize(
        self,
        stage: str,
        epoch: int,
        device: torch.device,
        all_gather: AllGather | None = None,
        world_size: int = 1,
    ) -> EpochSummary:
        """Reduce over ranks. ``all_gather`` stacks a tensor from every rank (``strategy.all_gather``).

        Epoch start-up is the slowest rank's; sums, counts and distributions cover all ranks.
        """
        timings = {}
        for name, metric in self._values.items():
            values = steady_values(self._timings, TIMINGS[name])
            # one NaN sentinel per rank, so that no rank syncs an empty state
            metric.update(torch.tensor([*values, math.nan], dtype=torch.float64))
            summary = _quantiles(metric.to(device).compute().cpu().reshape(-1))
            metric.reset()
            if summary.count:
                timings[name] = summary
        stalls = find_stalls(self._timings)
        local = torch.tensor(self._totals(stalls), dtype=torch.float64, device=device)
        per_rank = local.unsqueeze(0) if all_gather is None or world_size == 1 else all_gather(local)
        per_rank = per_rank.reshape(-1, local.numel()).cpu()
        totals = per_rank.sum(0)
        rank_wait = [_ratio(row[2].item(), row[6].item()) for row in per_rank]
        slowest, ratio = _straggler(rank_wait)
        return EpochSummary(
            stage=stage,
            epoch=epoch,
            steps=int(totals[6].item()),
            timings=timings,
            input_stall_fraction=_ratio(totals[0].item(), totals[1].item()),
            data_wait_share=_ratio(totals[2].item(), totals[3].item()),
            samples_per_sec=_ratio(totals[4].item(), totals[5].item()),
            epoch_start=_nan_max(per_rank[:, 7]),
            world_size=per_rank.shape[0],
            rank_data_wait=[value for value in rank_wait if value is not None],
            slowest_rank=slowest,
            straggler_ratio=ratio,
            on_device=any(timing.device_step_time is not None for timing in self._timings),
            stalls=stalls,
        )


def _nan_max(values: torch.Tensor) -> float | None:
    """The slowest rank's value (epoch start-up is as slow as the slowest rank)."""
    known = values[~torch.isnan(values)]
    return None if known.numel() == 0 else known.max().item()


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


_STRAGGLER_FLOOR_S = 1e-3


def _straggler(rank_wait: list[float | None]) -> tuple[int | None, float | None]:
    known = [(value, rank) for rank, value in enumerate(rank_wait) if value is not None]
    if not known:
        return None, None
    worst, slowest = max(known)
    best = min(value for value, _ in known)
    return slowest, max(worst, _STRAGGLER_FLOOR_S) / max(best, _STRAGGLER_FLOOR_S)
