"""TunedDataModule: loader settings, seeded sampling and autotune inside a Lightning run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "TunedDataModule",
]

if TYPE_CHECKING:
    from lightning_dataperf.datamodule.datamodule import TunedDataModule

__getattr__, __dir__ = attach(
    __name__,
    {
        "TunedDataModule": "datamodule",
    },
)
