"""lightning_dataperf: find and fix input-pipeline bottlenecks in PyTorch Lightning.

Example::

    from lightning import Trainer
    from lightning_dataperf import DataPerfCallback

    trainer = Trainer(callbacks=[DataPerfCallback()])
"""

from lightning_dataperf.callback import DataPerfCallback
from lightning_dataperf.diagnosis import Diagnosis, Finding, diagnose
from lightning_dataperf.stats import EpochSummary, TimingSummary
from lightning_dataperf.timing import StepClock, StepTiming

__version__ = "0.1.0"

__all__ = [
    "DataPerfCallback",
    "Diagnosis",
    "EpochSummary",
    "Finding",
    "StepClock",
    "StepTiming",
    "TimingSummary",
    "__version__",
    "diagnose",
]
