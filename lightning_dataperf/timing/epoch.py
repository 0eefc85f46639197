"""EpochAccumulator: one epoch of step timings in ``CatMetric`` states, reduced across ranks."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torchmetrics.aggregation import CatMetric

from lightning_dataperf.timing.clock import StepTiming
from lightning_dataperf.timing.summary import EpochSummary, Stall, TimingSummary
from lightning_dataperf.timing.window import TIMINGS, find_stalls, stall_totals, steady_values, throughput_totals

__all__ = ["EpochAccumulator"]

_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def _quantiles(values: torch.Tensor) -> TimingSummary:
    # Drops the one NaN sentinel per rank that summarize() adds.
    values = values[~torch.isnan(values)].double()
    if values.numel() == 0:
        nan = math.nan
        return TimingSummary(nan, nan, nan, nan, nan, 0)
    # quantile wants q in the input's dtype.
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

    Example::

        accumulator = EpochAccumulator()
        accumulator.update(clock.completed())
        summary = accumulator.summarize(stage="train", epoch=0, device=torch.device("cpu"))
        print(summary.format())
    """

    def __init__(self) -> None:
        # NaN sentinels must survive the sync; _quantiles drops them.
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
        # Stalls are reported apart and left out of the steady-state figures.
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
            # The sync runs on the strategy's device (NCCL gathers CUDA tensors only).
            summary = _quantiles(metric.to(device).compute().cpu().reshape(-1))
            metric.reset()
            if summary.count:
                timings[name] = summary
        stalls = find_stalls(self._timings)
        # All totals in one tensor: one all_gather per epoch, not one per figure.
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
    # The floor keeps a rank that never waits from making the ratio infinite.
    return slowest, max(worst, _STRAGGLER_FLOOR_S) / max(best, _STRAGGLER_FLOOR_S)
