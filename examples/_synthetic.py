"""Synthetic data and a small model shared by the examples and benchmarks."""

from __future__ import annotations

import time
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import Dataset

# Lightning 2.6.6 under torch 2.13 warns on every fit that `isinstance(treespec, LeafSpec)` is deprecated: its own
# code (lightning.pytorch.utilities._pytree, flattening the loaders), neither this package's nor the examples'.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


class SyntheticImages(Dataset):
    """Random 'images' whose per-sample cost is configurable.

    Args:
        length: number of samples.
        shape: shape of each sample.
        sleep_ms: host sleep per sample (I/O-like cost: releases the CPU).
        work_ms: busy CPU work per sample (decode/augment-like cost: holds the CPU).
    """

    def __init__(
        self,
        length: int = 512,
        shape: tuple[int, ...] = (3, 32, 32),
        sleep_ms: float = 0.0,
        work_ms: float = 0.0,
        num_classes: int = 10,
    ) -> None:
        self.length, self.shape = length, shape
        self.sleep_ms, self.work_ms, self.num_classes = sleep_ms, work_ms, num_classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1e3)
        if self.work_ms:
            deadline = time.perf_counter() + self.work_ms / 1e3
            while time.perf_counter() < deadline:
                pass
        generator = torch.Generator().manual_seed(index)
        return torch.rand(self.shape, generator=generator), index % self.num_classes


class SmallClassifier(pl.LightningModule):
    """A small MLP classifier; ``step_sleep_ms`` adds a known host delay per training step."""

    def __init__(self, in_features: int = 3 * 32 * 32, num_classes: int = 10, step_sleep_ms: float = 0.0) -> None:
        super().__init__()
        self.step_sleep_ms = step_sleep_ms
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, 256), nn.ReLU(), nn.Linear(256, num_classes))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        if self.step_sleep_ms:
            time.sleep(self.step_sleep_ms / 1e3)
        return nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)
