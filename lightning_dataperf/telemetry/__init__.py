"""What the machine has and is doing: hardware, metric sources, the sampler thread, workers, the hang watchdog."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "HangReport",
    "HangWatchdog",
    "Hardware",
    "SystemSampler",
    "SystemStats",
    "probe_hardware",
]

if TYPE_CHECKING:
    from lightning_dataperf.telemetry.hardware import Hardware, probe_hardware
    from lightning_dataperf.telemetry.stats import SystemStats
    from lightning_dataperf.telemetry.system_sampler import SystemSampler
    from lightning_dataperf.telemetry.watchdog import HangReport, HangWatchdog

__getattr__, __dir__ = attach(
    __name__,
    {
        "Hardware": "hardware",
        "probe_hardware": "hardware",
        "SystemStats": "stats",
        "SystemSampler": "system_sampler",
        "HangReport": "watchdog",
        "HangWatchdog": "watchdog",
    },
)
