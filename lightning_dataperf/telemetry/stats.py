"""The system readings as one typed record: each field is a ``Usage/<field>`` scalar."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_dataperf import tags

__all__ = ["SYSTEM_PREFIX", "SystemStats"]

SYSTEM_PREFIX = tags.USAGE_GROUP


@dataclass(frozen=True)
class SystemStats:
    """Interval means of the telemetry readings (units in the names: ``_mb`` MiB, ``_mbps`` MiB/s).

    A field is ``None`` when its source is missing (no GPU, no NVML, no ``/proc``) or has not read twice yet.

    Example::

        stats = SystemStats.from_mapping({"cpu_busy_percent_mean": 97.0})
        stats.cpu_busy_percent_mean          # 97.0
        stats.to_metrics()                   # {"Usage/cpu_busy_percent_mean": 97.0}
        SystemStats.tag("gpu_util_percent")  # "Usage/gpu_util_percent"
    """

    # GPU (NVML)
    gpu_util_percent: float | None = None
    gpu_memory_util_percent: float | None = None
    gpu_memory_used_mb: float | None = None
    gpu_sm_clock_mhz: float | None = None
    gpu_power_w: float | None = None
    gpu_slowdown: float | None = None
    gpu_power_capped: float | None = None
    gpu_clock_event_reasons: float | None = None
    gpu_pcie_rx_mbps: float | None = None
    gpu_pcie_tx_mbps: float | None = None
    # CPU cores (% of a core; mean and max across the cores)
    cpu_user_percent_mean: float | None = None
    cpu_user_percent_max: float | None = None
    cpu_system_percent_mean: float | None = None
    cpu_system_percent_max: float | None = None
    cpu_iowait_percent_mean: float | None = None
    cpu_iowait_percent_max: float | None = None
    cpu_busy_percent_mean: float | None = None
    cpu_busy_percent_max: float | None = None
    runnable_tasks: float | None = None
    # this process and its loader workers
    loader_workers_alive: float | None = None
    main_cpu_percent: float | None = None
    main_runqueue_percent: float | None = None  # this process's threads waiting for a core (% of one core)
    main_threads: float | None = None
    workers_cpu_percent: float | None = None
    worker_cpu_percent_mean: float | None = None
    main_rss_mb: float | None = None
    workers_rss_mb: float | None = None
    main_pss_mb: float | None = None
    workers_pss_mb: float | None = None
    major_faults_per_sec: float | None = None
    own_read_mbps: float | None = None  # what this process and its workers read (files, any filesystem)
    # memory
    ram_available_mb: float | None = None
    swap_used_mb: float | None = None
    shm_used_mb: float | None = None
    shm_free_mb: float | None = None
    pinned_host_mb: float | None = None
    # the dataset's disk
    disk_read_mbps: float | None = None
    disk_read_iops: float | None = None
    disk_await_ms: float | None = None
    disk_util_percent: float | None = None

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return _FIELDS

    @classmethod
    def tag(cls, name: str) -> str:
        """The logged tag of a field; a name that is no field is an error (tags are defined here only)."""
        if name not in _FIELD_SET:
            raise KeyError(f"{name!r} is not a SystemStats field")
        return SYSTEM_PREFIX + name

    @classmethod
    def from_mapping(cls, values: Mapping[str, float]) -> SystemStats:
        """From readings keyed by field name; unknown keys (a custom source's) are ignored here."""
        return cls(**{key: float(value) for key, value in values.items() if key in _FIELD_SET})

    def to_metrics(self) -> dict[str, float]:
        """``Usage/<field>`` -> value for every known field (the per-worker mean only with two workers or more: with
        one it is ``workers_cpu_percent``)."""
        known = self.known()
        # With one worker the per-worker mean only repeats workers_cpu_percent.
        if (self.loader_workers_alive or 0) < 2:
            known.pop("worker_cpu_percent_mean", None)
        return {SYSTEM_PREFIX + name: value for name, value in known.items()}

    def known(self) -> dict[str, float]:
        """Field name -> value for every known field."""
        return {name: value for name in _FIELDS if (value := getattr(self, name)) is not None}


_FIELDS = tuple(field.name for field in dataclasses.fields(SystemStats))
_FIELD_SET = frozenset(_FIELDS)
