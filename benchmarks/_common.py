"""The benchmarks' shared harness: the machine record, tables, JSON under results/, quiet Trainers, costly samples."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        import lightning

        info["lightning"] = lightning.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def write_json(name: str, payload: dict[str, Any], out_dir: str | None = None) -> Path:
    directory = Path(out_dir or os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    payload = {"machine": machine(), "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **payload}
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}")
    return path


def quiet_trainer(**options: Any) -> pl.Trainer:
    """A Trainer on one device with no logger, checkpoints, progress bar or model summary; ``options`` override."""
    defaults: dict[str, Any] = dict(
        devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    return pl.Trainer(**{**defaults, **options})


def fit_quietly(model: pl.LightningModule, loader: Any, **trainer_options: Any) -> pl.Trainer:
    """Fit one epoch (unless overridden) in a temporary directory, without bars, summaries or checkpoints."""
    options: dict[str, Any] = dict(
        devices=1, max_epochs=1, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False
    )
    options.update(trainer_options)
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(default_root_dir=root, **options)
        trainer.fit(model, loader)
    return trainer


class CostlySamples(Dataset):
    """16 features per sample; each sample costs ``sample_ms`` of sleep (I/O) or of CPU time (``busy``)."""

    def __init__(self, length: int, sample_ms: float = 0.0, busy: bool = False, stall_at: int | None = None) -> None:
        self.length, self.sample_ms, self.busy, self.stall_at = length, sample_ms, busy, stall_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.stall_at:
            time.sleep(3.0)
        if self.busy:  # a fixed amount of CPU work: the thread's CPU clock, so time-shared cores stretch it
            deadline = time.thread_time() + self.sample_ms / 1e3
            while time.thread_time() < deadline:
                pass
        elif self.sample_ms:
            time.sleep(self.sample_ms / 1e3)
        return torch.full((16,), float(index % 97))


class HostStepModel(pl.LightningModule):
    """A step of ``step_ms`` host sleep (the training process waits, as it would for a GPU step)."""

    def __init__(self, step_ms: float) -> None:
        super().__init__()
        self.step_ms, self.layer = step_ms, torch.nn.Linear(16, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        time.sleep(self.step_ms / 1e3)
        return self.layer(batch[:, :16]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def fit_with_dataperf(
    model: pl.LightningModule,
    loader: object,
    *,
    batches: int,
    epochs: int = 1,
    accelerator: str = "auto",
    strategy: object = "auto",
    callbacks: tuple = (),
    precision: str | None = None,
) -> dict:
    """Fit with DataPerfCallback; the last epoch's summary, verdict and samples/s."""
    from lightning_dataperf import DataPerfCallback  # after ROOT is on sys.path

    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.25)
    trainer = quiet_trainer(
        max_epochs=epochs,
        limit_train_batches=batches,
        accelerator=accelerator,
        strategy=strategy,
        callbacks=[perf, *callbacks],
        num_sanity_val_steps=0,
        default_root_dir=tempfile.mkdtemp(),
        precision=precision,
    )
    trainer.fit(model, loader)
    summary, diagnosis = perf.last_summary, perf.last_diagnosis
    return {"summary": summary, "diagnosis": diagnosis, "samples_per_sec": summary.samples_per_sec or 0.0}
