"""DataPerfCallback's hooks for the evaluation loops (validation, test, predict), made once for all three.

Each is set on the class under Lightning's hook name; an assertion fails at import if Lightning renames one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_dataperf.tags import Stage

__all__ = ["install_evaluation_hooks"]


def _evaluation_hooks(stage: Stage) -> tuple[Callable[..., None], ...]:
    """The four hooks of one evaluation loop; they differ from each other only in ``stage``."""

    def on_epoch_start(self: Any, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started(trainer, stage, self._boundary)

    def on_batch_start(
        self: Any,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_started(stage, dataloader_idx)

    def on_batch_end(
        self: Any,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_finished(stage, batch)

    def on_epoch_end(self: Any, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_finished(trainer, stage)

    return on_epoch_start, on_batch_start, on_batch_end, on_epoch_end


_EVAL_HOOKS = ("epoch_start", "batch_start", "batch_end", "epoch_end")


def install_evaluation_hooks(cls: type[Callback]) -> None:
    """Set ``on_{validation,test,predict}_{epoch_start,batch_start,batch_end,epoch_end}`` on ``cls``."""
    for stage, loop in ((Stage.VAL, "validation"), (Stage.TEST, "test"), (Stage.PREDICT, "predict")):
        for suffix, hook in zip(_EVAL_HOOKS, _evaluation_hooks(stage), strict=True):
            name = f"on_{loop}_{suffix}"
            assert callable(getattr(Callback, name)), name  # a hook Lightning calls: fails loudly if renamed
            hook.__name__ = hook.__qualname__ = name
            setattr(cls, name, hook)
