"""A TunedDataModule and a model that record exactly which samples each step saw."""

from __future__ import annotations

import random

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import TunedDataModule


class IndexedDataset(Dataset):
    """Sample ``i`` is ``[i, epoch, random draw]``: the index, the epoch the worker knows, an augmentation."""

    def __init__(self, length: int) -> None:
        self.length, self.epoch = length, -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), float(self.epoch), random.random()])


class IndexData(TunedDataModule):
    def __init__(self, length=30, batch_size=4, workers=None, val_length=0, **kwargs):
        super().__init__(**kwargs)
        self.length, self.batch_size, self.workers, self.val_length = length, batch_size, workers, val_length

    def train_dataloader(self):
        options = {} if self.workers is None else {"num_workers": self.workers}
        return DataLoader(IndexedDataset(self.length), batch_size=self.batch_size, shuffle=True, **options)

    def val_dataloader(self):
        if not self.val_length:
            return []
        return DataLoader(IndexedDataset(self.val_length), batch_size=self.batch_size, num_workers=0)


class RecordingModel(pl.LightningModule):
    """Records (epoch, sample index, worker epoch, draw) for every training sample, and val indices."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.rows: list[tuple[int, int, int, float]] = []
        self.val_indices: list[int] = []

    def training_step(self, batch, batch_idx):
        for index, epoch, draw in batch.tolist():
            self.rows.append((self.current_epoch, int(index), int(epoch), draw))
        return self.layer(batch[:, :1]).mean()

    def validation_step(self, batch, batch_idx):
        self.val_indices.extend(int(value) for value in batch[:, 0].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)
