"""DataPerfCallback: the Lightning hooks that drive timing, telemetry, diagnosis and the report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "DataPerfCallback",
]

if TYPE_CHECKING:
    from lightning_dataperf.callback.callback import DataPerfCallback

__getattr__, __dir__ = attach(
    __name__,
    {
        "DataPerfCallback": "callback",
    },
)
