"""lightning_dataperf: find and fix input-pipeline bottlenecks in PyTorch Lightning.

Example::

    from lightning import Trainer
    from lightning_dataperf import DataPerfCallback

    trainer = Trainer(callbacks=[DataPerfCallback()])
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from lightning_dataperf._lazy import attach
from lightning_dataperf._registration import register_when_lightning_loads

__version__ = "0.1.0"

# the front door: name -> subpackage that exports it (loaded on first use, so the import stays torch-free)
_EXPORTS = {
    "AutotuneResult": "autotune",
    "OnlineTuning": "autotune",
    "SearchTuning": "autotune",
    "autotune_loader": "autotune",
    "DataPerfCallback": "callback",
    "TunedDataModule": "datamodule",
    "GpuDecodeOptions": "decode",
    "Diagnosis": "diagnosis",
    "Finding": "diagnosis",
    "diagnose": "diagnosis",
    "LoaderSettings": "loader",
    "ShareBy": "loader",
    "recommend_loader_settings": "loader",
    "Hardware": "telemetry",
    "probe_hardware": "telemetry",
    "EpochSummary": "timing",
    "SideStreamDDPStrategy": "transfer",
    "SideStreamStrategy": "transfer",
    "SideStreamTransferMixin": "transfer",
}

# resolved here for one more release, with a DeprecationWarning: name -> its subpackage now
_MOVED = {
    "StepClock": "timing",
    "StepTiming": "timing",
    "TimingSummary": "timing",
    "SystemSampler": "telemetry",
    "SystemStats": "telemetry",
    "SideStreamCopier": "transfer",
    "CopyStats": "transfer",
    "CopyTiming": "transfer",
    "Evidence": "diagnosis",
    "LoaderFacts": "loader",
    "article_settings": "loader",
}

__all__ = [
    "AutotuneResult",
    "DataPerfCallback",
    "Diagnosis",
    "EpochSummary",
    "Finding",
    "GpuDecodeOptions",
    "Hardware",
    "LoaderSettings",
    "OnlineTuning",
    "SearchTuning",
    "ShareBy",
    "SideStreamDDPStrategy",
    "SideStreamStrategy",
    "SideStreamTransferMixin",
    "TunedDataModule",
    "__version__",
    "autotune_loader",
    "diagnose",
    "probe_hardware",
    "recommend_loader_settings",
]

if TYPE_CHECKING:
    from lightning_dataperf.autotune import AutotuneResult, OnlineTuning, SearchTuning, autotune_loader
    from lightning_dataperf.callback import DataPerfCallback
    from lightning_dataperf.datamodule import TunedDataModule
    from lightning_dataperf.decode import GpuDecodeOptions
    from lightning_dataperf.diagnosis import Diagnosis, Finding, diagnose
    from lightning_dataperf.loader import LoaderSettings, ShareBy, recommend_loader_settings
    from lightning_dataperf.telemetry import Hardware, probe_hardware
    from lightning_dataperf.timing import EpochSummary
    from lightning_dataperf.transfer import SideStreamDDPStrategy, SideStreamStrategy, SideStreamTransferMixin

_front_door, _ = attach(__name__, _EXPORTS)


def __getattr__(name: str) -> Any:
    moved = _MOVED.get(name)
    if moved is not None:
        warnings.warn(
            f"`lightning_dataperf.{name}` moved to `lightning_dataperf.{moved}.{name}`; the top-level name goes"
            " in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(f"{__name__}.{moved}"), name)
    return _front_door(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


register_when_lightning_loads()
