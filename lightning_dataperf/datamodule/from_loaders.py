"""The hooks :meth:`TunedDataModule.from_loaders` adds: your DataLoaders built again from their arguments."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from lightning_dataperf.loader.rebuild import loader_arguments

__all__ = ["TrainLoaders", "TrainValLoaders"]


class TrainLoaders:
    """A training loader's hook (mixed in before :class:`TunedDataModule`, whose arguments ``options`` are)."""

    def __init__(self, train: DataLoader, **options: Any) -> None:
        super().__init__(**options)
        self._train_arguments = loader_arguments(train)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(**self._train_arguments)


class TrainValLoaders(TrainLoaders):
    """The training and validation loaders' hooks."""

    def __init__(self, train: DataLoader, val: DataLoader, **options: Any) -> None:
        super().__init__(train, **options)
        self._val_arguments = loader_arguments(val)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(**self._val_arguments)
