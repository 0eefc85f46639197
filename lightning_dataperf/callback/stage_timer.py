"""The timing state of one stage (train, val, test or predict) for DataPerfCallback."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lightning_dataperf import tags
from lightning_dataperf.decode.stats import DecodeStats
from lightning_dataperf.loader.probe import BatchTiming, LoaderProbe, instrument, uninstrument
from lightning_dataperf.loader.settings import is_gpu_decode_loader
from lightning_dataperf.loader.stats import LoaderStats
from lightning_dataperf.tags import Stage
from lightning_dataperf.timing.clock import StepClock, StepTiming
from lightning_dataperf.timing.epoch import EpochAccumulator
from lightning_dataperf.timing.host_gap import HostGapProbe
from lightning_dataperf.timing.summary import EpochSummary
from lightning_dataperf.timing.window import window_metrics
from lightning_dataperf.transfer.stats import CopyStats, CopyTiming

__all__ = ["EVAL_COLLECT_EVERY", "StageTimer", "look_inside"]

#: Evaluation loops read finished steps back every this many batches (training: at each log point).
EVAL_COLLECT_EVERY = 64


@dataclass
class StageTimer:
    """Timing state of one stage. ``copies`` are this window's side-stream copies, ``epoch_copies`` the epoch's.

    It owns a :class:`~lightning_dataperf.timing.clock.StepClock`, the steps of the current logging window and
    of the epoch. Finished records are *collected* (read back without blocking) at log points and epoch ends,
    and every :data:`EVAL_COLLECT_EVERY` evaluation batches (evaluation has no log points).

    Example::

        timer = StageTimer(StepClock(device), Stage.TRAIN)
        timer.start_epoch(anchor=time.perf_counter())
        ...                                          # the clock is told about fetches and steps
        metrics = timer.window_metrics()             # {"Time/DataLoading": ..., ...}
    """

    clock: StepClock
    stage: Stage
    accumulator: EpochAccumulator = field(default_factory=EpochAccumulator)
    window: list[StepTiming] = field(default_factory=list)
    active: bool = False
    anchor: float | None = None
    batches: int = 0
    skipped: int = 0  # this epoch's batches Lightning skipped (not steps: no timing, no samples)
    dataloader_idx: int = 0
    copies: list[CopyTiming] = field(default_factory=list)
    epoch_copies: list[CopyTiming] = field(default_factory=list)
    probes: list[LoaderProbe] = field(default_factory=list)
    batches_window: list[BatchTiming] = field(default_factory=list)
    batches_epoch: list[BatchTiming] = field(default_factory=list)
    host_gap: HostGapProbe | None = None
    decode: Any = None  # a GpuDecodeLoader this stage reads from (its ``stats()`` are cumulative)
    # its figures at the last log point and epoch end, contiguous: batches decoded ahead of an epoch count in it
    decode_window: DecodeStats | None = None
    decode_epoch: DecodeStats | None = None
    engine_readings: list[float] = field(default_factory=list)  # the epoch's JPEG-engine readings (NVML, %)

    def watch_decode(self, loader: Any) -> None:
        """Log and judge a GPU-decode loader's own telemetry (``Decode/...``) with this stage's figures."""
        self.decode = loader
        self.decode_window = self.decode_epoch = loader.stats()

    def _decode_now(self) -> DecodeStats:
        now = self.decode.stats()
        if now.jpeg_util_percent is not None:
            self.engine_readings.append(now.jpeg_util_percent)
        return now

    def evaluation_batch_started(self, dataloader_idx: int = 0) -> None:
        """An evaluation batch starts; the first of another loader is not steady state after the last one's."""
        if dataloader_idx != self.dataloader_idx:
            self.dataloader_idx = dataloader_idx
            self.clock.break_continuity(new_epoch=True)
        self.clock.step_started()

    def evaluation_batch_finished(self, samples: int) -> None:
        """An evaluation batch ended (training's hook does the same inline, plus its log points)."""
        self.clock.step_finished(self.batches, samples=samples)
        self.batches += 1
        if self.batches % EVAL_COLLECT_EVERY == 0:
            self.collect()  # evaluation has no log points, only a queue to keep bounded

    def skip_batch(self) -> None:
        """Lightning skipped the batch begun (a ``None`` batch or step output): no step, counted apart."""
        self.clock.step_skipped()
        if self.host_gap is not None:
            self.host_gap.step_skipped()
        self.skipped += 1

    def collect(self) -> None:
        """Take the steps the device has finished (never blocks) and the loader's batch timings."""
        self._take(self.clock.completed())
        self._collect_batches()

    def _take(self, done: list[StepTiming]) -> None:
        if self.host_gap is not None and self.host_gap.active_this_epoch:
            covered = self.host_gap.covered  # steps the profiler slowed down: not steady state
            done = [timing for timing in done if timing.step not in covered]
        self.window.extend(done)
        self.accumulator.update(done)

    def _collect_batches(self) -> None:
        """The loader's batch timings, for the same steps as the step figures (not the epoch's first, not probed)."""
        covered = self.host_gap.covered if self.host_gap is not None and self.host_gap.active_this_epoch else ()
        for probe in self.probes:
            batches = [timing for timing in probe.completed() if timing.index > 0 and timing.index not in covered]
            self.batches_window.extend(batches)
            self.batches_epoch.extend(batches)

    @property
    def blind(self) -> str | None:
        """Why the inside of this stage's loader is not seen (``None``: it is, or no loader was processed)."""
        reasons = [probe.blind for probe in self.probes if probe.blind]
        return "; ".join(reasons) if reasons else None

    def collect_copies(self, strategy: Any) -> None:
        """Take the side-stream copy timings that have finished, if the strategy makes any."""
        pop = getattr(strategy, "completed_copies", None)
        if callable(pop):
            done = pop()
            self.copies.extend(done)
            self.epoch_copies.extend(done)

    def start_epoch(self, anchor: float) -> None:
        self.clock.break_continuity(new_epoch=True)
        self.accumulator.reset()
        self.window.clear()
        self.copies.clear()
        self.epoch_copies.clear()
        self._collect_batches()  # what arrived before the epoch (the first batches are fetched early)
        if self.host_gap is not None:
            self.host_gap.reset_epoch()
        self.batches_window.clear()
        self.active, self.anchor, self.batches, self.dataloader_idx, self.skipped = True, anchor, 0, 0, 0

    def window_metrics(self) -> dict[str, float]:
        """Metrics of the steps (and side-stream copies) since the last call; clears the window."""
        metrics = window_metrics(self.window, self.stage)
        if (copies := CopyStats.of(self.copies)) is not None:
            metrics.update(copies.to_metrics(self.stage.prefix))
        if (loader := LoaderStats.of(self.batches_window)) is not None:
            metrics.update(loader.to_metrics(self.stage.prefix))
        if self.decode is not None and self.decode_window is not None:
            now = self._decode_now()
            if (window := now.since(self.decode_window)).batches:
                metrics.update(window.to_metrics(self.stage.prefix))
            self.decode_window = now
        self.window.clear()
        self.copies.clear()
        self.batches_window.clear()
        return metrics

    def finish_epoch(self) -> None:
        """Take every outstanding step (waits once for the last one's end event)."""
        self._take(self.clock.flush())
        self._collect_batches()
        if self.host_gap is not None:
            self.host_gap.end_epoch()  # not through validation and checkpointing
        self.active = False

    def summarize(self, epoch: int, strategy: Any, world_size: int) -> EpochSummary:
        """The epoch's summary, reduced across ranks (a collective), with this rank's copy, loader, host-gap figures."""
        summary = self.accumulator.summarize(
            self.stage.value, epoch, device=strategy.root_device, all_gather=strategy.all_gather, world_size=world_size
        )
        loader = LoaderStats.of(self.batches_epoch)
        self.batches_epoch.clear()
        host_gap = None if self.host_gap is None else self.host_gap.result()
        if host_gap is not None and (span := summary.timings.get(tags.DEVICE_SPAN)) is not None:
            # The profiler's own per-launch cost stretches the steps it records; the unrecorded steps' span
            # (CUDA events, start to end of the step) is the honest span, and the busy time is the kernels'.
            host_gap = host_gap.with_span(span.p50)
        decode = None
        if self.decode is not None and self.decode_epoch is not None:
            now = self._decode_now()
            engine = sum(self.engine_readings) / len(self.engine_readings) if self.engine_readings else None
            decode = dataclasses.replace(now.since(self.decode_epoch), jpeg_util_percent=engine)
            self.decode_epoch, self.decode_window, self.engine_readings = now, now, []
        copies = CopyStats.of(self.epoch_copies)
        rank = int(getattr(strategy, "global_rank", 0))  # the figures above are this rank's own
        return dataclasses.replace(
            summary,
            copies=copies,
            loader=loader,
            host_gap=host_gap,
            decode=decode,
            rank=rank,
            skipped_batches=self.skipped,
        )

    def release(self) -> None:
        """Drop all state (teardown, exceptions)."""
        if self.host_gap is not None:
            self.host_gap.reset_epoch()  # stops a profiler left running by an exception
        self.clock.reset()
        self.window.clear()
        self.active = False
        self.decode = self.decode_window = self.decode_epoch = None  # let the GPU-decode loader go


def look_inside(train: StageTimer | None, loader: Any, running_stage: Any) -> Any:
    """A loader Lightning sets up (before its iterator exists): training's is instrumented for ``train``, the
    timer of the training stage (``None`` where this callback does not time it); another stage's is not."""
    if train is not None and running_stage == "train":  # RunningStage.TRAINING
        train.probes += [probe] if (probe := instrument(loader)) not in train.probes else []
        if is_gpu_decode_loader(loader):
            train.watch_decode(loader)
    elif running_stage != "train":
        # a copy Lightning rebuilt from an instrumented training loader must not yield timed batches; a training
        # loader is left to the callback that times training (several callbacks: one per stage)
        uninstrument(loader)
    return loader
