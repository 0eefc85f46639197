"""Telemetry sources: GPU (NVML), CPU cores, this process and its loader workers, memory, the dataset's disk.

Each ``read(elapsed)`` returns readings keyed by :class:`~lightning_dataperf.telemetry.stats.SystemStats` fields.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from lightning_dataperf.telemetry.hardware import block_device_of, shm_usage
from lightning_dataperf.telemetry.processes import ProcessSource

__all__ = [
    "CpuSource",
    "DiskSource",
    "GpuSource",
    "MemorySource",
    "ProcessSource",
    "Source",
    "nvml_handle",
    "pinned_host_mb",
]

_MB = 2**20
#: NVML clock-event bit of the software power cap: normal for a data-centre GPU running at its power limit.
_POWER_CAP = 0x4
#: NVML clock-event bits that mean the GPU is slowed down by heat or a hardware protection.
_SLOWDOWN_REASONS = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


class Source(Protocol):
    """One group of readings. ``read`` returns values keyed by ``SystemStats`` field; rates need two reads."""

    name: str

    def read(self, elapsed: float) -> dict[str, float]: ...

    def close(self) -> None: ...


class GpuSource:
    """NVML readings of one GPU: utilisation, memory, PCIe RX/TX bytes/s, SM clock, power, slowdowns.

    PCIe rates are deltas of NVML's byte counters (``NVML_FI_DEV_PCIE_COUNT_RX/TX_BYTES``), which the
    driver refreshes lazily and which some platforms do not maintain (``benchmarks/pcie_counters.py``). The
    copy figures DataPerfCallback measures itself (``Time/Transfer``, ``Transfer/copy_gbps``) do not depend on them.

    Args:
        device: the torch CUDA device index; mapped to NVML through the device UUID, so
            ``CUDA_VISIBLE_DEVICES`` renumbering is handled.
        nvml: the NVML binding (``pynvml``); tests pass a fake.
    """

    name = "gpu"

    def __init__(self, device: int, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        nvml.nvmlInit()
        self.handle = nvml_handle(nvml, device)
        self._pcie_fields = [nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]
        self._last_pcie: tuple[float, float] | None = None
        self._pcie_counters = True

    def read(self, elapsed: float) -> dict[str, float]:
        nvml, handle = self.nvml, self.handle
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        values = {
            "gpu_util_percent": float(utilization.gpu),
            "gpu_memory_util_percent": float(utilization.memory),
            "gpu_memory_used_mb": memory.used / _MB,
            "gpu_sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            # NVML reports milliwatts.
            "gpu_power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
        }
        reasons = int(_clock_event_reasons(nvml, handle))
        values["gpu_slowdown"] = float(any(reasons & bit for bit in _SLOWDOWN_REASONS))
        values["gpu_power_capped"] = float(bool(reasons & _POWER_CAP))
        values["gpu_clock_event_reasons"] = float(reasons)
        values.update(self._pcie(elapsed))
        return values

    def _pcie(self, elapsed: float) -> dict[str, float]:
        if self._pcie_counters:
            try:
                samples = self.nvml.nvmlDeviceGetFieldValues(self.handle, self._pcie_fields)
                rx, tx = (_field_value(sample) for sample in samples)
            except Exception:
                # Platforms that do not maintain the counters fail every time, so stop asking.
                self._pcie_counters = False
            else:
                previous, self._last_pcie = self._last_pcie, (rx, tx)
                # A rate needs two readings.
                if previous is None or elapsed <= 0:
                    return {}
                return {
                    # A counter that wrapped or was reset reads as no traffic, never negative.
                    "gpu_pcie_rx_mbps": max(0.0, rx - previous[0]) / _MB / elapsed,
                    "gpu_pcie_tx_mbps": max(0.0, tx - previous[1]) / _MB / elapsed,
                }
        # Fallback: NVML's own 20 ms throughput sample, in KB/s.
        rx = self.nvml.nvmlDeviceGetPcieThroughput(self.handle, self.nvml.NVML_PCIE_UTIL_RX_BYTES)
        tx = self.nvml.nvmlDeviceGetPcieThroughput(self.handle, self.nvml.NVML_PCIE_UTIL_TX_BYTES)
        return {"gpu_pcie_rx_mbps": rx * 1e3 / _MB, "gpu_pcie_tx_mbps": tx * 1e3 / _MB}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def nvml_handle(nvml: Any, device: int) -> Any:
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        # torch may print the UUID without NVML's "GPU-" prefix.
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:
        # Without a UUID the index is right unless CUDA_VISIBLE_DEVICES renumbers the GPUs.
        return nvml.nvmlDeviceGetHandleByIndex(device)


def _clock_event_reasons(nvml: Any, handle: Any) -> int:
    # NVML renamed throttle reasons to clock-event reasons; older bindings have only the old name.
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if read is None:
        read = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return read(handle)


def _field_value(sample: Any) -> float:
    # Raised so that _pcie falls back to NVML's own throughput sample.
    if getattr(sample, "nvmlReturn", 0) != 0:
        raise RuntimeError(f"NVML field {getattr(sample, 'fieldId', '?')} unsupported")
    value = sample.value
    # The union member that holds the value depends on the field's type.
    for kind in ("ullVal", "ulVal", "uiVal", "sllVal", "dVal"):
        if hasattr(value, kind):
            return float(getattr(value, kind))
    return float(value)


# ---------------------------------------------------------------------------------------- CPU
class CpuSource:
    """Per-core %user, %system and %iowait (mean and max across cores) and overall busy %.

    Example::

        cpu = CpuSource()
        time.sleep(1.0)
        cpu.read(elapsed=1.0)        # {"cpu_busy_percent_mean": 12.5, ...}
    """

    name = "cpu"

    def __init__(self) -> None:
        # A baseline, so that the first read already has a delta.
        self._last = psutil.cpu_times(percpu=True)

    def read(self, elapsed: float) -> dict[str, float]:
        now = psutil.cpu_times(percpu=True)
        previous, self._last = self._last, now
        # A CPU can go offline or come online between two readings.
        per_core = [_cpu_shares(before, after) for before, after in zip(previous, now, strict=False)]
        per_core = [shares for shares in per_core if shares is not None]
        if not per_core:
            return {}
        values: dict[str, float] = {}
        for key in ("user", "system", "iowait", "busy"):
            column = [shares[key] for shares in per_core]
            values[f"cpu_{key}_percent_mean"] = sum(column) / len(column)
            values[f"cpu_{key}_percent_max"] = max(column)
        if (runnable := _runnable_tasks()) is not None:
            values["runnable_tasks"] = runnable
        return values

    def close(self) -> None:
        pass


def _runnable_tasks() -> float | None:
    """Tasks running or waiting for a CPU right now (``/proc/loadavg``), not counting this reader."""
    try:
        running = Path("/proc/loadavg").read_text().split()[3].split("/")[0]
    except (OSError, IndexError):
        return None
    return max(0.0, float(running) - 1)


def _cpu_shares(before: Any, after: Any) -> dict[str, float] | None:
    total = sum(after) - sum(before)
    # Too short an interval: the core's tick counters have not moved yet.
    if total <= 0:
        return None

    def share(field: str) -> float:
        return 100.0 * max(0.0, getattr(after, field, 0.0) - getattr(before, field, 0.0)) / total

    # A core in iowait is idle, waiting on I/O: not busy.
    idle = share("idle") + share("iowait")
    busy = min(100.0, max(0.0, 100.0 - idle))
    return {"user": share("user"), "system": share("system"), "iowait": share("iowait"), "busy": busy}


# ---------------------------------------------------------------------------------------- memory


class MemorySource:
    """Available RAM, swap, ``/dev/shm`` used and free, pinned host memory held by PyTorch."""

    name = "memory"

    def read(self, elapsed: float) -> dict[str, float]:
        values = {
            "ram_available_mb": psutil.virtual_memory().available / _MB,
            "swap_used_mb": psutil.swap_memory().used / _MB,
        }
        if (shm := shm_usage()) is not None:
            values["shm_used_mb"] = shm[0] - shm[1]
            values["shm_free_mb"] = shm[1]
        if (pinned := pinned_host_mb()) is not None:
            values["pinned_host_mb"] = pinned
        return values

    def close(self) -> None:
        pass


def pinned_host_mb() -> float | None:
    """Pinned host memory reserved by PyTorch's CachingHostAllocator (``None`` before CUDA is used)."""
    # Reading the stats must not initialise CUDA in a process that never used it.
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    # Older torch releases have no host_memory_stats.
    read = getattr(torch.cuda, "host_memory_stats", None)
    if read is None:
        return None
    stats = read()
    for key in ("reserved_bytes.current", "allocated_bytes.current", "segment.all.current"):
        if key in stats:
            return stats[key] / _MB
    return None


# ---------------------------------------------------------------------------------------- disk
class DiskSource:
    """Read MB/s, read IOPS, average wait and %util of the disk holding the dataset (else all disks)."""

    name = "disk"

    def __init__(self, data_path: str | os.PathLike[str] | None = None) -> None:
        device = None if data_path is None else block_device_of(data_path)
        counters = psutil.disk_io_counters(perdisk=True) or {}
        if device is not None and device in counters:
            self.devices = [device]
        else:
            # Loop, RAM, device-mapper and optical devices are no dataset disk; stacked ones repeat its reads.
            self.devices = [name for name in counters if not name.startswith(("loop", "ram", "zram", "dm-", "sr"))]
        if not self.devices:
            # Raised so that the sampler drops this source with one warning.
            raise RuntimeError("no block devices visible in /proc/diskstats")
        self._last = counters

    def read(self, elapsed: float) -> dict[str, float]:
        now = psutil.disk_io_counters(perdisk=True) or {}
        previous, self._last = self._last, now
        read_bytes = reads = io_count = io_ms = 0.0
        util = 0.0
        for name in self.devices:
            if name not in now or name not in previous:
                continue
            after, before = now[name], previous[name]
            read_bytes += after.read_bytes - before.read_bytes
            reads += after.read_count - before.read_count
            io_count += after.read_count - before.read_count + after.write_count - before.write_count
            io_ms += after.read_time - before.read_time + after.write_time - before.write_time
            if hasattr(after, "busy_time") and elapsed > 0:
                # busy_time is in ms; several disks' utilisations do not add up, so the busiest one's.
                util = max(util, min(100.0, (after.busy_time - before.busy_time) / (10 * elapsed)))
        if elapsed <= 0:
            return {}
        return {
            "disk_read_mbps": read_bytes / _MB / elapsed,
            "disk_read_iops": reads / elapsed,
            "disk_await_ms": io_ms / io_count if io_count else 0.0,
            "disk_util_percent": util,
        }

    def close(self) -> None:
        pass
