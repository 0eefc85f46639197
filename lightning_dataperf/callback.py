"""DataPerfCallback: per-step data-wait, transfer and compute timing for every Lightning loop."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.data import extract_batch_size
from typing_extensions import override

from lightning_dataperf._lightning_hooks import FetchHooks
from lightning_dataperf.datamodule import TunedDataModule
from lightning_dataperf.diagnosis import Diagnosis, Evidence, LoaderFacts, diagnose
from lightning_dataperf.hardware import Hardware, pcie_capacity_mbps, probe_hardware
from lightning_dataperf.loggers import log_metrics
from lightning_dataperf.preflight import BatchFootprint, Problem, check_batch, check_loader
from lightning_dataperf.stats import EpochAccumulator, EpochSummary, TimingSummary, window_metrics
from lightning_dataperf.system import SystemSampler
from lightning_dataperf.timing import StepClock, StepTiming
from lightning_dataperf.transfer import CopyTiming, SideStreamTransferMixin, copy_metrics
from lightning_dataperf.watchdog import HangReport, HangWatchdog

__all__ = ["DataPerfCallback"]

#: Metric prefix per stage; training metrics carry none.
STAGE_PREFIX = {"train": "", "val": "val/", "test": "test/", "predict": "predict/"}
_LOOP_STAGE = {"train": "train", "val": "val", "validate": "val", "test": "test", "predict": "predict"}
#: Evaluation loops read finished steps back every this many batches (training: at each log point).
_EVAL_COLLECT_EVERY = 64
SUMMARY_FILE = "dataperf_summaries.jsonl"


@dataclass
class _StageTimer:
    """Timing state of one stage (train, val, test or predict)."""

    clock: StepClock
    accumulator: EpochAccumulator = field(default_factory=EpochAccumulator)
    window: list[StepTiming] = field(default_factory=list)
    active: bool = False
    anchor: float | None = None
    batches: int = 0
    dataloader_idx: int = 0
    copies: list[CopyTiming] = field(default_factory=list)
    epoch_copies: list[CopyTiming] = field(default_factory=list)

    def collect(self) -> list[StepTiming]:
        done = self.clock.completed()
        self.window.extend(done)
        self.accumulator.update(done)
        return done

    def start_epoch(self, anchor: float) -> None:
        self.clock.break_continuity(new_epoch=True)
        self.accumulator.reset()
        self.window.clear()
        self.copies.clear()
        self.epoch_copies.clear()
        self.active, self.anchor, self.batches, self.dataloader_idx = True, anchor, 0, 0

    def collect_copies(self, strategy: Any) -> None:
        if isinstance(strategy, SideStreamTransferMixin):
            done = strategy.pop_copy_timings()
            self.copies.extend(done)
            self.epoch_copies.extend(done)

    def window_metrics(self, prefix: str = "") -> dict[str, float]:
        """Metrics of the steps (and side-stream copies) since the last call; clears the window."""
        metrics = window_metrics(self.window, prefix)
        metrics.update(copy_metrics(self.copies, prefix))
        self.window.clear()
        self.copies.clear()
        return metrics

    def finish_epoch(self) -> None:
        done = self.clock.flush()
        self.window.extend(done)
        self.accumulator.update(done)
        self.active = False


class DataPerfCallback(Callback):
    r"""Time every batch fetch, host-to-device transfer and step, and say what binds.

    Logged through every attached logger, keyed by global step, at ``log_every_n_steps`` (means over
    the steps since the last log point, plus ``_max``):

    ``Time/DataLoading`` (host blocked in the loader's ``next()``), ``Time/Transfer``,
    ``Time/Compute``, ``Time/DeviceIdle`` (CUDA: GPU idle between steps), ``Time/Step``,
    ``Throughput/samples_per_sec``, ``DataPerf/input_stall_fraction`` and, per epoch,
    ``Time/EpochStart`` and ``Epoch/...`` percentiles. Evaluation loops log the same under
    ``val/``, ``test/`` and ``predict/``. On CUDA the step figures come from CUDA events read back
    lazily, so the callback never synchronises the device per step.

    A telemetry thread samples the GPU (NVML: utilisation, PCIe RX/TX, clocks, power), CPU cores,
    loader workers, memory, ``/dev/shm`` and the dataset's disk, logged as ``System/...`` means. At
    each epoch end the timings and telemetry become a verdict (:attr:`last_diagnosis`), printed on
    rank zero, logged as TensorBoard text and appended to ``<log_dir>/dataperf_summaries.jsonl``.
    At fit start pre-flight checks warn about ``/dev/shm``, open files, pinned RAM, fork-after-CUDA
    and oversubscribed CPUs, and a watchdog reports (never kills) a loader that delivers nothing for
    ``hang_timeout`` seconds.

    Args:
        batch_size_fn: returns the number of samples in a batch (default: Lightning's
            ``extract_batch_size``), used for throughput.
        log_every_n_steps: overrides the Trainer's ``log_every_n_steps``.
        print_summary: print the epoch table and verdict on rank zero.
        write_json: append each epoch's summary and verdict to ``<log_dir>/dataperf_summaries.jsonl``.
        stages: which loops to time.
        telemetry: run the system sampler thread.
        telemetry_interval: seconds between system readings.
        data_path: where the dataset lives, so disk metrics watch that device (else all disks).
        preflight: run the pre-flight checks at fit start and on the first batch.
        hang_timeout: seconds without a batch before the watchdog reports; ``None`` turns it off.

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
        stages: tuple[str, ...] = ("train", "val", "test", "predict"),
        telemetry: bool = True,
        telemetry_interval: float = 1.0,
        data_path: str | os.PathLike[str] | None = None,
        preflight: bool = True,
        hang_timeout: float | None = 300.0,
    ) -> None:
        unknown = set(stages) - set(STAGE_PREFIX)
        if unknown:
            raise ValueError(f"DataPerfCallback(stages=...) got {sorted(unknown)}; choose from {list(STAGE_PREFIX)}.")
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"DataPerfCallback(log_every_n_steps={log_every_n_steps}) must be >= 1.")
        if telemetry_interval <= 0:
            raise ValueError(f"DataPerfCallback(telemetry_interval={telemetry_interval}) must be > 0 seconds.")
        if hang_timeout is not None and hang_timeout <= 0:
            raise ValueError(f"DataPerfCallback(hang_timeout={hang_timeout}) must be > 0 seconds, or None for off.")
        self.batch_size_fn = batch_size_fn
        self.log_every_n_steps = log_every_n_steps
        self.print_summary = print_summary
        self.write_json = write_json
        self.stages = tuple(stages)
        self.telemetry = telemetry
        self.telemetry_interval = telemetry_interval
        self.data_path = data_path
        self.preflight = preflight
        self.hang_timeout = hang_timeout
        self.preflight_problems: list[Problem] = []
        self.hang_reports: list[HangReport] = []
        self.hardware: Hardware | None = None
        self.sampler: SystemSampler | None = None
        self._watchdog: HangWatchdog | None = None
        self._batch_checked = False
        self.summaries: list[EpochSummary] = []
        self.diagnoses: list[Diagnosis] = []
        self._timers: dict[str, _StageTimer] = {}
        self._hooks = FetchHooks(before=self._on_fetch_start, after=self._on_fetch_end)
        self._boundary = time.perf_counter()
        self._train_epochs_started = 0
        self._batch_size_warned = False

    # ------------------------------------------------------------------ results
    @property
    def last_summary(self) -> EpochSummary | None:
        """The most recent epoch summary of any stage."""
        return self.summaries[-1] if self.summaries else None

    @property
    def last_diagnosis(self) -> Diagnosis | None:
        """The most recent verdict."""
        return self.diagnoses[-1] if self.diagnoses else None

    def diagnose_now(self, trainer: pl.Trainer, stage: str = "train") -> Diagnosis | None:
        """Verdict on the steps measured so far in the current epoch (local to this rank)."""
        timer = self._timers.get(stage)
        if timer is None:
            return None
        timer.collect()
        summary = timer.accumulator.summarize(stage, trainer.current_epoch, torch.device("cpu"))
        return diagnose(self._evidence(trainer, summary))

    # ------------------------------------------------------------------ lifecycle
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        device = trainer.strategy.root_device
        self._timers = {name: _StageTimer(StepClock(device)) for name in self.stages}
        self._hooks.install(trainer)
        self._boundary = time.perf_counter()
        self._train_epochs_started = 0
        self._batch_checked = False
        self.hardware = probe_hardware(self.data_path, accelerator=device.type)
        self._start_sampler(device)

    def _start_sampler(self, device: torch.device) -> None:
        ticks = []
        if self.hang_timeout is not None:
            self._watchdog = HangWatchdog(self.hang_timeout, report=self._on_hang)
            ticks.append(self._watchdog.check)
        if not (self.telemetry or ticks):
            return
        cuda_device = device.index if device.type == "cuda" and self.telemetry else None
        sources = None if self.telemetry else []
        self.sampler = SystemSampler(self.telemetry_interval, cuda_device, self.data_path, sources, on_tick=ticks)
        self.sampler.start()

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
        self._watchdog = None
        self._hooks.uninstall()
        for timer in self._timers.values():
            timer.clock.reset()
            timer.window.clear()
            timer.active = False

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._boundary = time.perf_counter()
        if isinstance(trainer.logger, TensorBoardLogger) and trainer.is_global_zero:
            _write_custom_scalars(trainer.logger)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = _first_loader(trainer.train_dataloader)
        if self.preflight and self.hardware is not None and loader is not None:
            problems = check_loader(loader, self.hardware)
            if isinstance(trainer.datamodule, TunedDataModule):
                # It warned about an explicit num_workers when it built the loader, and autotune's
                # choice is measured: saying it again here would only repeat or contradict that.
                problems = [problem for problem in problems if problem.check != "workers_exceed_cpus"]
            self._warn(trainer, problems)

    def _check_first_batch(self, trainer: pl.Trainer, batch: Any) -> None:
        if self._batch_checked or not self.preflight or self.hardware is None:
            return
        self._batch_checked = True
        loader = _first_loader(trainer.train_dataloader)
        if loader is not None:
            self._warn(trainer, check_batch(BatchFootprint.of(batch), loader, self.hardware))

    def _warn(self, trainer: pl.Trainer, problems: list[Problem]) -> None:
        self.preflight_problems.extend(problems)
        if trainer.is_global_zero:
            for problem in problems:
                warnings.warn(f"DataPerf pre-flight [{problem.check}]: {problem.message}", stacklevel=2)

    @override
    def on_sanity_check_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._boundary = time.perf_counter()

    # ------------------------------------------------------------------ fetch hooks
    def _on_fetch_start(self, loop_stage: str) -> None:
        if self._watchdog is not None:
            self._watchdog.fetch_started()
        timer = self._timers.get(_LOOP_STAGE[loop_stage])
        if timer is not None and timer.active:
            timer.clock.fetch_started()

    def _on_fetch_end(self, loop_stage: str) -> None:
        timer = self._timers.get(_LOOP_STAGE[loop_stage])
        if self._watchdog is not None:
            self._watchdog.batch_arrived(None if timer is None else timer.batches)
        if timer is None or not timer.active:
            return
        timer.clock.fetch_finished()
        if timer.accumulator.epoch_start is None and timer.anchor is not None:
            timer.accumulator.epoch_start = time.perf_counter() - timer.anchor

    # ------------------------------------------------------------------ shared step logic
    def _epoch_started(self, trainer: pl.Trainer, stage: str, anchor: float) -> None:
        timer = self._timers.get(stage)
        if timer is not None and not trainer.sanity_checking:
            timer.start_epoch(anchor)

    def _batch_started(self, trainer: pl.Trainer, stage: str, dataloader_idx: int = 0) -> None:
        timer = self._timers.get(stage)
        if timer is None or not timer.active:
            return
        if dataloader_idx != timer.dataloader_idx:
            timer.dataloader_idx = dataloader_idx
            timer.clock.break_continuity(new_epoch=True)
        timer.clock.step_started()

    def _batch_finished(self, trainer: pl.Trainer, stage: str, batch: Any) -> None:
        """An evaluation batch ended (training's on_train_batch_end does the same inline, plus logging)."""
        timer = self._timers.get(stage)
        if timer is None or not timer.active:
            return
        timer.clock.step_finished(timer.batches, samples=self._batch_size(batch))
        timer.batches += 1
        if timer.batches % _EVAL_COLLECT_EVERY == 0:
            timer.collect()  # evaluation has no log points, only a queue to keep bounded

    def _epoch_finished(self, trainer: pl.Trainer, stage: str) -> None:
        if self._watchdog is not None:
            self._watchdog.idle()
        timer = self._timers.get(stage)
        if timer is None or not timer.active:
            return
        timer.finish_epoch()
        timer.collect_copies(trainer.strategy)
        window = timer.window_metrics()
        if stage == "train":
            self._log(trainer, window)
        summary = timer.accumulator.summarize(
            stage,
            trainer.current_epoch,
            device=trainer.strategy.root_device,
            all_gather=trainer.strategy.all_gather,
            world_size=trainer.world_size,
        )
        if timer.epoch_copies:
            summary = dataclasses.replace(summary, transfer_overlap=copy_metrics(timer.epoch_copies))
        self._report(trainer, summary)

    def _report(self, trainer: pl.Trainer, summary: EpochSummary) -> None:
        diagnosis = diagnose(self._evidence(trainer, summary))
        self.summaries.append(summary)
        self.diagnoses.append(diagnosis)
        prefix = STAGE_PREFIX[summary.stage]
        metrics = summary.to_metrics(prefix)
        if summary.stage != "train":
            metrics.update(_mean_metrics(summary, prefix))
        self._log(trainer, metrics)
        if not trainer.is_global_zero:
            return
        if self.print_summary:
            print(f"{summary.format()}\n{diagnosis.format()}", flush=True)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                text = "```\n" + summary.format() + "\n" + diagnosis.format() + "\n```"
                logger.experiment.add_text(f"{prefix}DataPerf/diagnosis", text, trainer.global_step)
        if self.write_json and (directory := _log_dir(trainer)) is not None:
            os.makedirs(directory, exist_ok=True)
            record = {
                "summary": summary.to_dict(),
                "diagnosis": diagnosis.to_dict(),
                "global_step": trainer.global_step,
            }
            with open(os.path.join(directory, SUMMARY_FILE), "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, default=str) + "\n")

    def _evidence(self, trainer: pl.Trainer, summary: EpochSummary) -> Evidence:
        loader = trainer.train_dataloader if summary.stage == "train" else None
        system = self.sampler.epoch_means() if self.sampler is not None and summary.stage == "train" else {}
        hardware = self.hardware
        return Evidence(
            summary=summary,
            loader=LoaderFacts.of(_first_loader(loader)),
            system=system,
            side_stream_transfer=isinstance(trainer.strategy, SideStreamTransferMixin),
            usable_cpus=None if hardware is None else hardware.cpus_per_rank,
            pcie_capacity_mbps=_pcie_capacity(hardware, trainer.strategy.root_device),
        )

    def _log(self, trainer: pl.Trainer, metrics: dict[str, float]) -> None:
        if trainer.is_global_zero:
            log_metrics(trainer.loggers, metrics, step=trainer.global_step)

    def _batch_size(self, batch: Any) -> int | None:
        try:
            if self.batch_size_fn is not None:
                return int(self.batch_size_fn(batch))
            # What extract_batch_size returns (the first tensor's first dimension), ~20x cheaper.
            first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
            if not isinstance(first, torch.Tensor):
                first = _first_tensor(batch)
            if first is not None:
                shape = first.shape
                return shape[0] if shape else 1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return extract_batch_size(batch)
        except Exception as error:  # a batch we cannot size must never stop training
            if not self._batch_size_warned:
                self._batch_size_warned = True
                warnings.warn(
                    f"DataPerfCallback could not tell the batch size ({error}); throughput is not logged. "
                    "Pass DataPerfCallback(batch_size_fn=lambda batch: ...) to fix this.",
                    stacklevel=2,
                )
            return None

    # ------------------------------------------------------------------ training hooks
    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Epoch 0's loader iterator (worker start-up) is created before this hook; later ones after it.
        anchor = self._boundary if self._train_epochs_started == 0 else time.perf_counter()
        self._train_epochs_started += 1
        self._epoch_started(trainer, "train", anchor)
        if self.sampler is not None:
            self.sampler.reset_epoch()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The four per-batch hooks are kept to a few calls each: at a 4 ms step, 1% is 40 us.
        if not self._batch_checked:
            self._check_first_batch(trainer, batch)  # before the step's clock starts: not counted as compute
        timer = self._timers.get("train")
        if timer is not None and timer.active:
            timer.clock.step_started()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._boundary = time.perf_counter()
        timer = self._timers.get("train")
        if timer is None or not timer.active:
            return
        timer.clock.step_finished(timer.batches, samples=self._batch_size(batch))
        timer.batches += 1
        if timer.batches % (self.log_every_n_steps or trainer.log_every_n_steps or 1) == 0:
            self._log_window(trainer, timer)

    def _log_window(self, trainer: pl.Trainer, timer: _StageTimer) -> None:
        timer.collect()  # here, not per step: read-back and bookkeeping cost once per log point
        timer.collect_copies(trainer.strategy)
        metrics = timer.window_metrics()
        if self.sampler is not None:
            metrics.update(self.sampler.window_means())
        self._log(trainer, metrics)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_finished(trainer, "train")

    # ------------------------------------------------------------------ evaluation hooks
    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        train = self._timers.get("train")
        if train is not None and not trainer.sanity_checking:
            train.clock.break_continuity()
        self._epoch_started(trainer, "val", self._boundary)

    @override
    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_started(trainer, "val", dataloader_idx)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_finished(trainer, "val", batch)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_finished(trainer, "val")
        self._boundary = time.perf_counter()

    @override
    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started(trainer, "test", self._boundary)

    @override
    def on_test_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_started(trainer, "test", dataloader_idx)

    @override
    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_finished(trainer, "test", batch)

    @override
    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_finished(trainer, "test")

    @override
    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started(trainer, "predict", self._boundary)

    @override
    def on_predict_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_started(trainer, "predict", dataloader_idx)

    @override
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_finished(trainer, "predict", batch)

    @override
    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_finished(trainer, "predict")

    # ------------------------------------------------------------------ checkpointing
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"summaries": [summary.to_dict() for summary in self.summaries]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.summaries = [_summary_from_dict(raw) for raw in state_dict.get("summaries", [])]


def _first_tensor(batch: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor in depth-first order through tensors, mappings, lists and tuples."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)):
        values: Any = batch
    elif isinstance(batch, dict):
        values = batch.values()
    else:
        return None
    if depth > 8:
        return None
    for value in values:
        if (found := _first_tensor(value, depth + 1)) is not None:
            return found
    return None


def _pcie_capacity(hardware: Hardware | None, device: torch.device) -> float | None:
    if hardware is None or device.type != "cuda" or not hardware.gpus:
        return None
    gpu = hardware.gpus[min(device.index or 0, len(hardware.gpus) - 1)]
    return pcie_capacity_mbps(gpu)


def _mean_metrics(summary: EpochSummary, prefix: str) -> dict[str, float]:
    metrics = {f"{prefix}Time/{name}": timing.mean for name, timing in summary.timings.items()}
    if summary.samples_per_sec is not None:
        metrics[f"{prefix}Throughput/samples_per_sec"] = summary.samples_per_sec
    if summary.input_stall_fraction is not None:
        metrics[f"{prefix}DataPerf/input_stall_fraction"] = summary.input_stall_fraction
    return metrics


def _summary_from_dict(raw: dict[str, Any]) -> EpochSummary:
    raw = dict(raw)
    raw["timings"] = {name: TimingSummary(**values) for name, values in raw.get("timings", {}).items()}
    return EpochSummary(**raw)


def _first_loader(loader: Any) -> Any:
    flattened = getattr(loader, "flattened", None)
    if flattened:
        return flattened[0]
    return loader


def _log_dir(trainer: pl.Trainer) -> str | None:
    for logger in trainer.loggers:
        directory = getattr(logger, "log_dir", None)
        if directory:
            return str(directory)
    return trainer.default_root_dir if trainer.loggers else None


#: TensorBoard custom-scalars layout. Tags are regular expressions, anchored so that ``Time/Compute``
#: does not also pull in ``Time/Compute_max`` or ``Epoch/Time/Compute_p90``.
CUSTOM_SCALARS = {
    "DataPerf": {
        "Data wait vs compute (s)": [
            "Multiline",
            ["^Time/DataLoading$", "^Time/Compute$", "^Time/Transfer$", "^Time/DeviceIdle$"],
        ],
        "Step time (s)": ["Multiline", ["^Time/Step$", "^Time/Step_max$"]],
        "Input stall fraction": ["Multiline", ["^DataPerf/input_stall_fraction$"]],
        "System (%)": ["Multiline", ["^System/gpu_util_percent$", "^System/cpu_busy_percent_mean$"]],
    }
}


def _write_custom_scalars(logger: TensorBoardLogger) -> None:
    """One TensorBoard chart with Time/DataLoading and Time/Compute (and the rest) together."""
    logger.experiment.add_custom_scalars(CUSTOM_SCALARS)
