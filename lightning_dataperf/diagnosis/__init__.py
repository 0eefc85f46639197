"""The verdict: Evidence in, rules, Diagnosis out; no Lightning and no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "Diagnosis",
    "Evidence",
    "Finding",
    "diagnose",
]

if TYPE_CHECKING:
    from lightning_dataperf.diagnosis.diagnose import diagnose
    from lightning_dataperf.diagnosis.evidence import Evidence
    from lightning_dataperf.diagnosis.findings import Diagnosis, Finding

__getattr__, __dir__ = attach(
    __name__,
    {
        "diagnose": "diagnose",
        "Evidence": "evidence",
        "Diagnosis": "findings",
        "Finding": "findings",
    },
)
