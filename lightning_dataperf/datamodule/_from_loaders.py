"""The modules :meth:`TunedDataModule.from_loaders` builds: your loaders made again from their arguments."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from lightning_dataperf.datamodule.datamodule import TunedDataModule
from lightning_dataperf.loader.rebuild import loader_arguments

__all__ = ["TrainLoaderModule", "TrainValLoaderModule"]


class TrainLoaderModule(TunedDataModule):
    """:meth:`TunedDataModule.from_loaders` with a training loader only."""

    def __init__(self, train: DataLoader, **options: Any) -> None:
        super().__init__(**options)
        self._train_arguments = loader_arguments(train)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(**self._train_arguments)


class TrainValLoaderModule(TrainLoaderModule):
    """:meth:`TunedDataModule.from_loaders` with a validation loader too."""

    def __init__(self, train: DataLoader, val: DataLoader, **options: Any) -> None:
        super().__init__(train, **options)
        self._val_arguments = loader_arguments(val)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(**self._val_arguments)
