"""Shared helpers for the benchmark scripts: CUDA sleep calibration, tables and JSON output."""

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
