"""Small models and data sets with known costs, for the tests."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_dataperf.testing import SleepCollate, SleepingLoaderDataset


def sleepy_loader(length: int, batch_size: int, sleep_s: float, **kwargs) -> DataLoader:
    """``length`` samples of 8 features; each *batch* costs ``sleep_s`` of host time (in the collate)."""
    dataset = SleepingLoaderDataset(length, features=8)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=SleepCollate(sleep_s * 1e3), **kwargs)


class SleepyModel(pl.LightningModule):
    """A linear model whose training/eval steps sleep ``step_s`` on the host."""

    def __init__(self, step_s: float = 0.0, features: int = 8) -> None:
        super().__init__()
        self.step_s = step_s
        self.layer = nn.Linear(features, 1)
        self.seen: list[torch.Tensor] = []

    def _step(self, batch):
        if self.step_s:
            time.sleep(self.step_s)
        return self.layer(batch).pow(2).mean()

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[:, 0].clone())
        return self._step(batch)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        return self._step(batch)

    def test_step(self, batch, batch_idx):
        return self._step(batch)

    def predict_step(self, batch, batch_idx):
        return self._step(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
