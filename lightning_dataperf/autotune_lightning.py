"""Autotune inside a Lightning run: rank zero searches for a TunedDataModule's training loader, the others receive it.

Example::

    class Data(TunedDataModule):
        ...
    Trainer(...).fit(model, datamodule=Data(autotune=True))   # calls autotune_for_datamodule once
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_dataperf import tags
from lightning_dataperf.autotune import AutotuneResult, autotune_loader

__all__ = ["autotune_for_datamodule"]


def autotune_for_datamodule(module: Any, explicit: Mapping[str, Any]) -> AutotuneResult:
    """Run the search for a TunedDataModule's training loader; rank zero searches, the others receive it."""
    options = dict(module.autotune_options)
    trainer = getattr(module, "trainer", None)
    loader_kwargs = {key: value for key, value in explicit.items() if key not in {"dataset", "batch_size"}}
    device = None
    options.setdefault("min_workers", 1)  # the main process will be busy training
    if trainer is not None:
        device = trainer.strategy.root_device if trainer.strategy.root_device.type == "cuda" else torch.device("cpu")
        options.setdefault("max_epochs", trainer.max_epochs)
    result = None
    if trainer is None or trainer.is_global_zero:
        result = autotune_loader(
            explicit["dataset"],
            explicit.get("batch_size", 1) or 1,
            loader_kwargs,
            hardware=module.hardware,
            device=device,
            **options,
        )
    if trainer is not None and trainer.world_size > 1:
        result = trainer.strategy.broadcast(result, src=0)
    assert result is not None
    if trainer is None or trainer.is_global_zero:
        print(result.format(), flush=True)
        for logger in trainer.loggers if trainer is not None else []:
            logger.log_hyperparams(
                {
                    "dataperf/autotune_batches_per_sec": result.chosen_batches_per_sec,
                    "dataperf/autotune_ceiling_speedup": result.ceiling_speedup,
                }
            )
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text(tags.AUTOTUNE_TEXT, f"```\n{result.format()}\n```")
    return result
