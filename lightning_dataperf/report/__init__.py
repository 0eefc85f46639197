"""What a run writes (logger scalars, TensorBoard layout, summaries file) and the offline report that reads it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "RunData",
    "find_runs",
    "load_run",
]

if TYPE_CHECKING:
    from lightning_dataperf.report.run import RunData, find_runs, load_run

__getattr__, __dir__ = attach(
    __name__,
    {
        "RunData": "run",
        "find_runs": "run",
        "load_run": "run",
    },
)
