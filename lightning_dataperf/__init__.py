"""lightning_dataperf: find and fix input-pipeline bottlenecks in PyTorch Lightning.

Example::

    from lightning import Trainer
    from lightning_dataperf import DataPerfCallback

    trainer = Trainer(callbacks=[DataPerfCallback()])
"""

from lightning_dataperf.autotune import AutotuneResult, autotune_loader
from lightning_dataperf.callback import DataPerfCallback
from lightning_dataperf.datamodule import TunedDataModule
from lightning_dataperf.diagnosis import Diagnosis, Finding, diagnose
from lightning_dataperf.hardware import Hardware, probe_hardware
from lightning_dataperf.policy import LoaderSettings, article_settings, recommend_loader_settings
from lightning_dataperf.stats import EpochSummary, TimingSummary
from lightning_dataperf.system import SystemSampler
from lightning_dataperf.timing import StepClock, StepTiming
from lightning_dataperf.transfer import (
    SideStreamCopier,
    SideStreamDDPStrategy,
    SideStreamStrategy,
    SideStreamTransferMixin,
)

__version__ = "0.1.0"

__all__ = [
    "AutotuneResult",
    "DataPerfCallback",
    "Diagnosis",
    "EpochSummary",
    "Finding",
    "Hardware",
    "LoaderSettings",
    "SideStreamCopier",
    "SideStreamDDPStrategy",
    "SideStreamStrategy",
    "SideStreamTransferMixin",
    "StepClock",
    "StepTiming",
    "SystemSampler",
    "TimingSummary",
    "TunedDataModule",
    "__version__",
    "article_settings",
    "autotune_loader",
    "diagnose",
    "probe_hardware",
    "recommend_loader_settings",
]
