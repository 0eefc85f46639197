"""The source article's timing approach, kept only to measure how wrong it is.

Host ``time.time()`` between hooks, logged with ``LightningModule.log(name, float)`` every step
(which copies each float to the module's device).
"""

from __future__ import annotations

import time

import lightning.pytorch as pl


class NaiveHostTimer(pl.Callback):
    def __init__(self) -> None:
        self.data_times: list[float] = []
        self.compute_times: list[float] = []
        self._last_end: float | None = None
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.time()
        if self._last_end is not None:
            data_time = self._start - self._last_end
            self.data_times.append(data_time)
            pl_module.log("Naive/DataLoading", data_time)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        end = time.time()
        compute_time = end - self._start
        self.compute_times.append(compute_time)
        pl_module.log("Naive/Compute", compute_time)
        self._last_end = end
