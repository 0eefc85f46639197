"""DataPerfCallback: the Lightning hooks that time data wait, transfer and compute in every loop, nothing else.

Per-stage state is :class:`~lightning_dataperf.callback.stage_timer.StageTimer`'s (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from lightning_dataperf._lightning_hooks import FetchHooks, ProcessDataloaderHook, global_step_reader
from lightning_dataperf.batches import BatchSizer
from lightning_dataperf.callback.evaluation_hooks import install_evaluation_hooks
from lightning_dataperf.callback.run_evidence import autotune_seconds, gather_evidence
from lightning_dataperf.callback.several import OnePerStage
from lightning_dataperf.callback.stage_timer import StageTimer, look_inside
from lightning_dataperf.diagnosis.diagnose import diagnose
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Diagnosis
from lightning_dataperf.loader.preflight import FitPreflight, Problem
from lightning_dataperf.report.loggers import log_metrics
from lightning_dataperf.report.outputs import EpochOutputs
from lightning_dataperf.tags import Stage
from lightning_dataperf.telemetry.hardware import Hardware, probe_hardware, trainer_ranks
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.telemetry.system_sampler import SystemSampler
from lightning_dataperf.telemetry.watchdog import HangReport, HangWatchdog
from lightning_dataperf.timing.clock import StepClock
from lightning_dataperf.timing.host_gap import HostGapProbe
from lightning_dataperf.timing.summary import EpochSummary

__all__ = ["DataPerfCallback"]

_SEQUENCES = (list, tuple)


class DataPerfCallback(OnePerStage):
    r"""Time every batch fetch, host-to-device transfer and step, and say what binds.

    Logged through every attached logger, keyed by global step, at ``log_every_n_steps`` (means over
    the steps since the last log point, plus ``_max``):

    ``Time/DataLoading`` (host blocked in the loader's ``next()``), ``Time/Transfer``,
    ``Time/Compute``, ``Time/DeviceIdle`` (CUDA: GPU idle between steps), ``Time/Step``,
    ``Time/SamplesPerSec``, ``Time/InputStallFraction`` and, per epoch, ``Time/EpochStart``
    and the 90th percentiles ``Time/DataLoading_p90``, ``Time/Compute_p90``. Evaluation loops log the same under
    ``val/``, ``test/`` and ``predict/``. On CUDA the step figures come from CUDA events read back
    lazily, so the callback never synchronises the device per step.

    Inside every training DataLoader (``Workers/...``: fetch, collate, pin, hand-over, busy fraction,
    measured in the workers), telemetry (``Usage/...``) and, on CUDA, a per-epoch host-gap probe feed
    each epoch's verdict (:attr:`last_diagnosis`), printed on rank zero, logged as TensorBoard text and
    appended to ``<log_dir>/dataperf_summaries.jsonl``. Pre-flight checks warn at fit start; a watchdog
    reports (never kills) a loader that delivers nothing for ``hang_timeout`` seconds.

    Args:
        batch_size_fn: returns the number of samples in a batch (default: Lightning's
            ``extract_batch_size``), used for throughput.
        log_every_n_steps: overrides the Trainer's ``log_every_n_steps``.
        print_summary: print the epoch table and verdict on rank zero.
        write_json: append each epoch's summary and verdict to ``<log_dir>/dataperf_summaries.jsonl``.
        stages: which loops to time: one name (``"train"``) or several (``("train", "val")``). Several callbacks
            in one Trainer each time their own stages (``stages="train"`` and ``stages="val"``), never the same.
        telemetry: run the system sampler thread.
        telemetry_interval: seconds between system readings.
        data_path: where the dataset lives, so disk metrics watch that device (else all disks).
        preflight: run the pre-flight checks at fit start and on the first batch.
        hang_timeout: seconds without a batch before the watchdog reports; ``None`` turns it off.
        host_gap_probe: on CUDA, profile a few steps per epoch to split the step's device span into GPU
            busy time and host gap (``Time/Compute``, ``Time/HostGap``); ``False`` turns it off, a
            :class:`~lightning_dataperf.timing.host_gap.HostGapProbe` sets which steps.
        clock: host clock in seconds (default ``time.perf_counter``; tests inject a fake one).

    Example::

        from lightning import Trainer
        from lightning_dataperf import DataPerfCallback

        perf = DataPerfCallback()
        trainer = Trainer(max_epochs=3, callbacks=[perf])
        trainer.fit(model, datamodule=data)
        print(perf.last_diagnosis.format())    # "input-bound (...): the GPU sits idle ..."
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        log_every_n_steps: int | None = None,
        print_summary: bool = True,
        write_json: bool = True,
        stages: str | Iterable[str] = ("train", "val", "test", "predict"),
        telemetry: bool = True,
        telemetry_interval: float = 1.0,
        data_path: str | os.PathLike[str] | None = None,
        preflight: bool = True,
        hang_timeout: float | None = 300.0,
        host_gap_probe: HostGapProbe | bool | None = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"DataPerfCallback(log_every_n_steps={log_every_n_steps}) must be >= 1.")
        if telemetry_interval <= 0:
            raise ValueError(f"DataPerfCallback(telemetry_interval={telemetry_interval}) must be > 0 seconds.")
        if hang_timeout is not None and hang_timeout <= 0:
            raise ValueError(f"DataPerfCallback(hang_timeout={hang_timeout}) must be > 0 seconds, or None for off.")
        self.batch_size_fn = batch_size_fn
        self.log_every_n_steps = log_every_n_steps
        try:
            self.stages = Stage.parse(stages)  # one name or several
        except ValueError as error:
            raise ValueError(f"DataPerfCallback: {error}") from None
        self.telemetry = telemetry
        self.telemetry_interval = telemetry_interval
        self.data_path = data_path
        self.preflight = preflight
        self.hang_timeout = hang_timeout
        self.outputs = EpochOutputs(print_summary=print_summary, write_json=write_json)
        self._preflight = FitPreflight()
        self.preflight_problems: list[Problem] = self._preflight.problems
        self.hang_reports: list[HangReport] = []
        self.hardware: Hardware | None = None
        self.sampler: SystemSampler | None = None
        self.summaries: list[EpochSummary] = []
        self.diagnoses: list[Diagnosis] = []
        self._clock = clock
        self._watchdog: HangWatchdog | None = None
        self._timers: dict[Stage, StageTimer] = {}
        self._train: StageTimer | None = None  # self._timers.get(Stage.TRAIN), read in the per-step hooks
        # both fixed per epoch: the log interval in optimizer steps, and when a window is logged without one
        self._log_every = 1
        self._stuck_after = 4
        self._global_step: Callable[[], int] = lambda: 0  # trainer.global_step, without its property walk
        self._hooks = FetchHooks(before=self._on_fetch_start, after=self._on_fetch_end)
        self._loader_hook = ProcessDataloaderHook(after=self._on_loader)
        self._autotune_before: Any = None
        self._boundary = clock()
        self._train_epochs_started, self._logged_step, self._logged_batches = 0, -1, 0
        self._batch_size = BatchSizer(batch_size_fn)
        self._host_gap_option = host_gap_probe
        self._automatic = True  # the module's automatic_optimization, read per epoch (skipped steps)

    @property
    def last_summary(self) -> EpochSummary | None:
        """The most recent epoch summary of any stage."""
        return self.summaries[-1] if self.summaries else None

    @property
    def last_diagnosis(self) -> Diagnosis | None:
        """The most recent verdict."""
        return self.diagnoses[-1] if self.diagnoses else None

    # ------------------------------------------------------------------ lifecycle
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.check_stages_apart(trainer)
        device = trainer.strategy.root_device
        self._timers = {name: StageTimer(StepClock(device, self._clock), name) for name in self.stages}
        self._hooks.install(trainer)
        self._loader_hook.install(trainer)
        self._train = train = self._timers.get(Stage.TRAIN)
        if train is not None and device.type == "cuda" and self._host_gap_option:
            probe = self._host_gap_option
            train.host_gap = probe if isinstance(probe, HostGapProbe) else HostGapProbe()
        self._autotune_before = getattr(trainer.datamodule, "autotune_result", None)
        self._boundary = self._clock()
        self._train_epochs_started = 0
        self._preflight.batch_checked = False
        self._logged_step, self._logged_batches = -1, 0
        self.hardware = probe_hardware(self.data_path, accelerator=device.type, local_ranks=trainer_ranks(trainer))
        if self.telemetry:
            cuda_device = device.index if device.type == "cuda" else None
            self.sampler = SystemSampler(self.telemetry_interval, cuda_device, self.data_path)
            self.sampler.start()
        if self.hang_timeout is not None:
            self._watchdog = HangWatchdog(self.hang_timeout, report=self._on_hang)
            self._watchdog.start()

    def _on_hang(self, report: HangReport) -> None:
        self.hang_reports.append(report)
        print(report.format(), file=sys.stderr, flush=True)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release()

    def _release(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        self._hooks.uninstall()
        self._loader_hook.uninstall()
        for timer in self._timers.values():
            timer.release()

    def _on_loader(self, loader: Any, running_stage: Any) -> Any:
        """Every loader Lightning sets up passes here (before its iterator exists): look inside training's."""
        return look_inside(self._timers.get(Stage.TRAIN), loader, running_stage)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._boundary = self._clock()
        self.outputs.write_layout(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.preflight and self.hardware is not None:
            self._preflight.at_train_start(trainer, self.hardware)  # before any batch

    @override
    def on_sanity_check_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._boundary = self._clock()

    # ------------------------------------------------------------------ fetch hooks
    def _on_fetch_start(self, stage: Stage) -> None:
        if self._watchdog is not None:
            self._watchdog.fetch_started()
        timer = self._timers.get(stage)
        if timer is not None and timer.active:
            timer.clock.fetch_started()

    def _on_fetch_end(self, stage: Stage) -> None:
        timer = self._timers.get(stage)
        if self._watchdog is not None:
            self._watchdog.batch_arrived(None if timer is None else timer.batches)
        if timer is None or not timer.active:
            return
        timer.clock.fetch_finished()
        if timer.accumulator.epoch_start is None and timer.anchor is not None:
            timer.accumulator.epoch_start = self._clock() - timer.anchor

    # ------------------------------------------------------------------ shared step logic
    def _epoch_started(self, trainer: pl.Trainer, stage: Stage, anchor: float) -> None:
        if stage is Stage.VAL and (train := self._timers.get(Stage.TRAIN)) is not None and not trainer.sanity_checking:
            train.clock.break_continuity()  # validation inside fit: the next train step's gap is not steady state
        timer = self._timers.get(stage)
        if timer is not None and not trainer.sanity_checking:
            timer.start_epoch(anchor)

    def _batch_started(self, stage: Stage, dataloader_idx: int = 0) -> None:
        if (timer := self._timers.get(stage)) is not None and timer.active:
            timer.evaluation_batch_started(dataloader_idx)

    def _batch_finished(self, stage: Stage, batch: Any) -> None:
        if (timer := self._timers.get(stage)) is not None and timer.active:
            timer.evaluation_batch_finished(self._batch_size(batch))

    def _epoch_finished(self, trainer: pl.Trainer, stage: Stage) -> None:
        if self._watchdog is not None:
            self._watchdog.idle()
        if stage is Stage.VAL:
            self._boundary = self._clock()
        timer = self._timers.get(stage)
        if timer is None or not timer.active:
            return
        timer.finish_epoch()
        timer.collect_copies(trainer.strategy)
        window = timer.window_metrics()
        if stage is Stage.TRAIN:
            self._log(trainer, window)
        summary = timer.summarize(trainer.current_epoch, trainer.strategy, trainer.world_size)
        if stage is Stage.TRAIN and summary.epoch_start is not None and (search := self._autotune_seconds(trainer)):
            # the search ran inside train_dataloader(), after the epoch's anchor: it is autotune's time, not start-up
            summary = dataclasses.replace(summary, epoch_start=max(0.0, summary.epoch_start - search))
        self._report(trainer, summary)

    def _autotune_seconds(self, trainer: pl.Trainer) -> float:
        """Seconds of a search run in this fit, before its first training epoch (once; 0 for a cache hit)."""
        result = getattr(trainer.datamodule, "autotune_result", None)
        if result is None or result is self._autotune_before:
            return 0.0
        self._autotune_before = result
        return autotune_seconds(result)

    def _report(self, trainer: pl.Trainer, summary: EpochSummary) -> None:
        diagnosis = diagnose(self._evidence(trainer, summary))
        self.summaries.append(summary)
        self.diagnoses.append(diagnosis)
        stage = Stage(summary.stage)
        metrics = summary.to_metrics(stage)
        if stage is not Stage.TRAIN:
            metrics.update(summary.mean_metrics(stage))
        self._log(trainer, metrics)
        self.outputs.publish(trainer, summary, diagnosis)

    def _evidence(self, trainer: pl.Trainer, summary: EpochSummary) -> Evidence:
        timer, train = self._timers.get(Stage(summary.stage)), summary.stage == Stage.TRAIN.value
        system = self.sampler.epoch_means() if self.sampler is not None and train else SystemStats()
        blind = timer.blind if timer is not None and timer.probes else "this stage's loader is not instrumented"
        return gather_evidence(trainer, summary, system=system, hardware=self.hardware, loader_blind=blind)

    def _log(self, trainer: pl.Trainer, metrics: dict[str, float]) -> None:
        if trainer.is_global_zero:
            log_metrics(trainer.loggers, metrics, step=trainer.global_step)

    # ------------------------------------------------------------------ training hooks
    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Epoch 0's loader iterator (worker start-up) is created before this hook; later ones after it.
        anchor = self._boundary if self._train_epochs_started == 0 else self._clock()
        self._train_epochs_started += 1
        self._log_every = every = self.log_every_n_steps or trainer.log_every_n_steps or 1  # per optimizer step
        self._stuck_after = 4 * every * max(1, trainer.accumulate_grad_batches)
        self._global_step = global_step_reader(trainer)
        self._automatic = pl_module.automatic_optimization
        self._epoch_started(trainer, Stage.TRAIN, anchor)
        if self.sampler is not None:
            self.sampler.reset_epoch()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # the per-batch hooks are kept to a few calls: 1% of a 4 ms step is 40 us
        if not self._preflight.batch_checked:
            if self.preflight and self.hardware is not None:  # before the step's clock: not counted as compute
                self._preflight.first_batch(trainer, batch, self.hardware)
            self._preflight.batch_checked = True
        timer = self._train
        if timer is not None and timer.active:
            if timer.host_gap is not None:
                timer.host_gap.step_started(timer.batches)
            timer.clock.step_started()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._boundary = self._clock()
        timer = self._train
        if timer is None or not timer.active:
            return
        # Lightning's skipped batch: a None batch gives outputs None; a training_step returning None gives {}
        # under automatic optimization (manual optimization returns {} for every step that returns nothing)
        if outputs is None or (self._automatic and type(outputs) is dict and not outputs):
            return timer.skip_batch()
        # samples_in's answer for the common (tensor, ...) batch, without its calls (the hot path is cache-cold)
        first = batch[0] if type(batch) in _SEQUENCES and batch and self.batch_size_fn is None else None
        if type(first) is torch.Tensor:
            shape = first.shape
            samples = shape[0] if shape else 1
        else:
            samples = self._batch_size(batch)
        clock, batches = timer.clock, timer.batches
        clock.step_finished(batches, samples)
        if timer.host_gap is not None and timer.host_gap.step_finished(batches):
            clock.break_continuity()  # stopping the profiler waited for the GPU: not the next step's time
        timer.batches = batches = batches + 1
        step = self._global_step()  # trainer.global_step: per optimizer step
        stuck = batches - self._logged_batches >= self._stuck_after  # no optimizer steps at all
        if (step != self._logged_step and step % self._log_every == 0) or stuck:
            self._logged_step, self._logged_batches = step, batches
            self._log_window(trainer, timer)

    def _log_window(self, trainer: pl.Trainer, timer: StageTimer) -> None:
        timer.collect()  # here, not per step: read-back and bookkeeping cost once per log point
        timer.collect_copies(trainer.strategy)
        metrics = timer.window_metrics()
        if self.sampler is not None:
            metrics.update(self.sampler.window_means().to_metrics())
        self._log(trainer, metrics)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_finished(trainer, Stage.TRAIN)

    # ------------------------------------------------------------------ checkpointing
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"summaries": [summary.to_dict() for summary in self.summaries]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.summaries = [EpochSummary.from_dict(raw) for raw in state_dict.get("summaries", [])]


install_evaluation_hooks(DataPerfCallback)
