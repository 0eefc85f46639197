"""Where DataPerfCallback's results go besides the loggers' scalars: console, TensorBoard text, JSON lines.

All of it happens on global rank zero. The JSON-lines file (``dataperf_summaries.jsonl``) sits in the
first logger's ``log_dir``, or the Trainer's ``default_root_dir`` without one.

Example::

    outputs = EpochOutputs(print_summary=True, write_json=True)
    outputs.write_layout(trainer)                     # once, at fit start
    outputs.publish(trainer, summary, diagnosis)      # each epoch end
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_dataperf import tags
from lightning_dataperf.findings import Diagnosis
from lightning_dataperf.stats import EpochSummary
from lightning_dataperf.system_stats import SystemStats
from lightning_dataperf.tags import Stage

__all__ = ["CUSTOM_SCALARS", "EpochOutputs", "log_dir"]


def _exactly(*names: str) -> list[str]:
    """Tags as anchored regular expressions: ``Time/Compute`` must not also pull in ``Time/Compute_max``."""
    return [f"^{name}$" for name in names]


#: TensorBoard custom-scalars layout (one chart each, so that their series can be told apart).
CUSTOM_SCALARS = {
    "DataPerf": {
        "Data wait vs compute (s)": [
            "Multiline",
            _exactly(*(tags.time(name) for name in (tags.DATA_LOADING, tags.COMPUTE, tags.TRANSFER, tags.DEVICE_IDLE))),
        ],
        "Step time (s)": ["Multiline", _exactly(tags.time(tags.STEP), tags.time(tags.STEP) + "_max")],
        "Input stall fraction": ["Multiline", _exactly(tags.INPUT_STALL)],
        "System (%)": [
            "Multiline",
            _exactly(SystemStats.tag("gpu_util_percent"), SystemStats.tag("cpu_busy_percent_mean")),
        ],
    }
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
    """Prints, writes TensorBoard text and appends JSON lines for each epoch's summary and verdict."""

    print_summary: bool = True
    write_json: bool = True
    written_to: str | None = None  # the summaries file, once written (named on the console the first time)

    def write_layout(self, trainer: pl.Trainer) -> None:
        """The custom-scalars charts, once per run, into the first logger if it is TensorBoard's."""
        if isinstance(trainer.logger, TensorBoardLogger) and trainer.is_global_zero:
            trainer.logger.experiment.add_custom_scalars(CUSTOM_SCALARS)

    def publish(self, trainer: pl.Trainer, summary: EpochSummary, diagnosis: Diagnosis) -> None:
        if not trainer.is_global_zero:
            return
        text = f"{summary.format()}\n{diagnosis.format()}"
        if self.print_summary:
            print(text, flush=True)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                tag = Stage(summary.stage).prefix + tags.DIAGNOSIS_TEXT
                logger.experiment.add_text(tag, f"```\n{text}\n```", trainer.global_step)
        if self.write_json and not trainer.fast_dev_run:
            directory = log_dir(trainer)
            os.makedirs(directory, exist_ok=True)
            record = {
                "summary": summary.to_dict(),
                "diagnosis": diagnosis.to_dict(),
                "global_step": trainer.global_step,
            }
            path = os.path.join(directory, tags.SUMMARY_FILE)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, default=str) + "\n")
            if self.written_to != path:
                self.written_to = path
                if self.print_summary:
                    print(f"DataPerf: epoch summaries and verdicts are appended to {path}", flush=True)
