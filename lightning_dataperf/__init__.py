"""lightning_dataperf: find and fix input-pipeline bottlenecks in PyTorch Lightning.

Example::

    from lightning import Trainer
    from lightning_dataperf import DataPerfCallback

    trainer = Trainer(callbacks=[DataPerfCallback()])
"""

from lightning_dataperf.autotune import AutotuneResult, autotune_loader
from lightning_dataperf.callback import DataPerfCallback
from lightning_dataperf.copier import SideStreamCopier
from lightning_dataperf.copy_stats import CopyStats, CopyTiming
from lightning_dataperf.datamodule import TunedDataModule
from lightning_dataperf.diagnosis import diagnose
from lightning_dataperf.evidence import Evidence
from lightning_dataperf.findings import Diagnosis, Finding
from lightning_dataperf.hardware import Hardware, probe_hardware
from lightning_dataperf.loaders import LoaderFacts, LoaderSettings
from lightning_dataperf.policy import article_settings, recommend_loader_settings
from lightning_dataperf.stats import EpochSummary, TimingSummary
from lightning_dataperf.strategies import SideStreamDDPStrategy, SideStreamStrategy, SideStreamTransferMixin
from lightning_dataperf.system_stats import SystemStats
from lightning_dataperf.telemetry import SystemSampler
from lightning_dataperf.timing import StepClock, StepTiming

__version__ = "0.1.0"

__all__ = [
    "AutotuneResult",
    "CopyStats",
    "CopyTiming",
    "DataPerfCallback",
    "Diagnosis",
    "EpochSummary",
    "Evidence",
    "Finding",
    "Hardware",
    "LoaderFacts",
    "LoaderSettings",
    "SideStreamCopier",
    "SideStreamDDPStrategy",
    "SideStreamStrategy",
    "SideStreamTransferMixin",
    "StepClock",
    "StepTiming",
    "SystemSampler",
    "SystemStats",
    "TimingSummary",
    "TunedDataModule",
    "__version__",
    "article_settings",
    "autotune_loader",
    "diagnose",
    "probe_hardware",
    "recommend_loader_settings",
]
