"""Per-step clocks under asynchronous CUDA, the host-gap probe, and their window and epoch reductions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "EpochAccumulator",
    "EpochSummary",
    "HostGapProbe",
    "HostGapStats",
    "Stall",
    "StepClock",
    "StepTiming",
    "TimingSummary",
]

if TYPE_CHECKING:
    from lightning_dataperf.timing.clock import StepClock, StepTiming
    from lightning_dataperf.timing.epoch import EpochAccumulator
    from lightning_dataperf.timing.host_gap import HostGapProbe, HostGapStats
    from lightning_dataperf.timing.summary import EpochSummary, Stall, TimingSummary

__getattr__, __dir__ = attach(
    __name__,
    {
        "StepClock": "clock",
        "StepTiming": "clock",
        "HostGapProbe": "host_gap",
        "HostGapStats": "host_gap",
        "EpochSummary": "summary",
        "Stall": "summary",
        "TimingSummary": "summary",
        "EpochAccumulator": "epoch",
    },
)
