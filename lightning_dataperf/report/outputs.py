"""Where DataPerfCallback's results go besides the loggers' scalars: console, TensorBoard text, JSON lines."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.findings import Diagnosis
from lightning_dataperf.tags import Stage
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.timing.summary import EpochSummary

__all__ = ["CUSTOM_SCALARS", "EpochOutputs", "custom_scalars", "log_dir"]


def _exactly(*names: str) -> list[str]:
    """Tags as anchored regular expressions: ``Time/Compute`` must not also pull in ``Time/Compute_max``."""
    return [f"^{name}$" for name in names]


def _with_max(name: str) -> list[str]:
    """One timing's window mean and its ``_max``."""
    return _exactly(tags.time(name), tags.time(name) + "_max")


_SPAN = f"{tags.time(tags.DEVICE_SPAN)}: the step's span on the GPU, mean and max (s)"
_HOST_GAP = f"{tags.time(tags.HOST_GAP)}: the GPU waiting for the host inside the step, per epoch (s)"
_IDLE = f"{tags.time(tags.DEVICE_IDLE)}: GPU idle between steps, mean and max (s)"
_GPU = f"{SystemStats.tag('gpu_util_percent')}: GPU utilisation (%)"
#: TensorBoard custom-scalars layout: one quantity per chart (mean and max), since a run's series share its colour.
CUSTOM_SCALARS = {
    "DataPerf": {
        f"{tags.time(tags.DATA_LOADING)}: data loading per step, mean and max (s)": [
            "Multiline",
            _with_max(tags.DATA_LOADING),
        ],
        f"{tags.time(tags.COMPUTE)}: compute per step, mean and max (s; CUDA: GPU busy, per epoch)": [
            "Multiline",
            _with_max(tags.COMPUTE),
        ],
        _SPAN: ["Multiline", _with_max(tags.DEVICE_SPAN)],
        _HOST_GAP: ["Multiline", _exactly(tags.time(tags.HOST_GAP))],
        f"{tags.time(tags.STEP)}: step time, mean and max (s)": ["Multiline", _with_max(tags.STEP)],
        f"{tags.INPUT_STALL}: share of step time lost to input": ["Multiline", _exactly(tags.INPUT_STALL)],
        f"{tags.time(tags.TRANSFER)}: host-to-device copy, mean and max (s)": ["Multiline", _with_max(tags.TRANSFER)],
        _IDLE: ["Multiline", _with_max(tags.DEVICE_IDLE)],
        f"{SystemStats.tag('cpu_busy_percent_mean')}: CPU busy, mean across cores (%)": [
            "Multiline",
            _exactly(SystemStats.tag("cpu_busy_percent_mean")),
        ],
        _GPU: ["Multiline", _exactly(SystemStats.tag("gpu_util_percent"))],
    }
}
#: The charts of quantities measured on CUDA only, left out of a run on another device.
CUDA_CHARTS = (_SPAN, _HOST_GAP, _IDLE, _GPU)


def custom_scalars(cuda: bool) -> dict[str, dict[str, list]]:
    """The layout for a run on CUDA (every chart) or on another device (no empty GPU charts)."""
    return {
        category: {title: chart for title, chart in charts.items() if cuda or title not in CUDA_CHARTS}
        for category, charts in CUSTOM_SCALARS.items()
    }


def log_dir(trainer: pl.Trainer) -> str:
    """Where the run's files go: the first logger's directory, else the Trainer's ``default_root_dir``."""
    for logger in trainer.loggers:
        directory = getattr(logger, "log_dir", None)
        if directory:
            return str(directory)
    return str(trainer.default_root_dir)


@dataclass
class EpochOutputs:
    """Prints, writes TensorBoard text and appends JSON lines for each epoch's summary and verdict.

    All of it happens on global rank zero. The JSON-lines file (``dataperf_summaries.jsonl``) sits in the
    first logger's ``log_dir``, or the Trainer's ``default_root_dir`` without one.

    Example::

        outputs = EpochOutputs(print_summary=True, write_json=True)
        outputs.write_layout(trainer)                     # once, at fit start
        outputs.publish(trainer, summary, diagnosis)      # each epoch end
    """

    print_summary: bool = True
    write_json: bool = True
    written_to: str | None = None  # the summaries file, once written (named on the console the first time)

    def write_layout(self, trainer: pl.Trainer) -> None:
        """The custom-scalars charts, once per run, into the first logger if it is TensorBoard's."""
        if isinstance(trainer.logger, TensorBoardLogger) and trainer.is_global_zero:
            # No empty GPU charts for a run on another device.
            cuda = trainer.strategy.root_device.type == "cuda"
            trainer.logger.experiment.add_custom_scalars(custom_scalars(cuda))

    def publish(self, trainer: pl.Trainer, summary: EpochSummary, diagnosis: Diagnosis) -> None:
        # One console text and one file record per epoch, not one per rank.
        if not trainer.is_global_zero:
            return
        text = f"{summary.format()}\n{diagnosis.format()}"
        if self.print_summary:
            print(text, flush=True)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                tag = Stage(summary.stage).prefix + tags.DIAGNOSIS_TEXT
                # A code block: TensorBoard renders text as Markdown, which would reflow the table.
                logger.experiment.add_text(tag, f"```\n{text}\n```", trainer.global_step)
        # As with Lightning's loggers, a fast_dev_run leaves no files behind.
        if self.write_json and not trainer.fast_dev_run:
            directory = log_dir(trainer)
            os.makedirs(directory, exist_ok=True)
            record = {
                "summary": summary.to_dict(),
                "diagnosis": diagnosis.to_dict(),
                "global_step": trainer.global_step,
            }
            path = os.path.join(directory, tags.SUMMARY_FILE)
            # One line per record: a run killed mid-append loses at most its last one.
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, default=str) + "\n")
            if self.written_to != path:
                self.written_to = path
                if self.print_summary:
                    print(f"DataPerf: epoch summaries and verdicts are appended to {path}", flush=True)
