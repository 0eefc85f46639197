"""Telemetry sources: GPU (NVML), CPU cores, this process and its loader workers, memory, the dataset's disk.

Each ``read(elapsed)`` returns readings keyed by :class:`~lightning_dataperf.telemetry.stats.SystemStats` fields.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from lightning_dataperf.telemetry.hardware import block_device_of, shm_usage
from lightning_dataperf.telemetry.processes import loader_worker_processes, major_faults, pss_mb

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
    copy figures that DataPerfCallback measures itself (``Time/Transfer``, ``Transfer/GBps``) do not depend on them.

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
                self._pcie_counters = False
            else:
                previous, self._last_pcie = self._last_pcie, (rx, tx)
                if previous is None or elapsed <= 0:
                    return {}
                return {
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
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:
        return nvml.nvmlDeviceGetHandleByIndex(device)


def _clock_event_reasons(nvml: Any, handle: Any) -> int:
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if read is None:
        read = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return read(handle)


def _field_value(sample: Any) -> float:
    if getattr(sample, "nvmlReturn", 0) != 0:
        raise RuntimeError(f"NVML field {getattr(sample, 'fieldId', '?')} unsupported")
    value = sample.value
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
        self._last = psutil.cpu_times(percpu=True)

    def read(self, elapsed: float) -> dict[str, float]:
        now = psutil.cpu_times(percpu=True)
        previous, self._last = self._last, now
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
    if total <= 0:
        return None

    def share(field: str) -> float:
        return 100.0 * max(0.0, getattr(after, field, 0.0) - getattr(before, field, 0.0)) / total

    idle = share("idle") + share("iowait")
    busy = min(100.0, max(0.0, 100.0 - idle))
    return {"user": share("user"), "system": share("system"), "iowait": share("iowait"), "busy": busy}


# ---------------------------------------------------------------------------------------- processes


class ProcessSource:
    """CPU%, memory and major page faults of the main process and the loader workers.

    RSS is read every time (cheap). PSS, which counts pages shared between forked workers once,
    costs ~10 ms per process to read (``smaps_rollup`` walks every mapping), so it is refreshed
    every ``pss_every`` seconds and repeated in between.
    """

    name = "processes"

    def __init__(
        self, workers: Callable[[], list[psutil.Process]] = loader_worker_processes, pss_every: float = 10.0
    ) -> None:
        self.main = psutil.Process()
        self.workers = workers
        self.pss_every = pss_every
        self._cpu_seconds: dict[int, float] = {}
        self._major_faults: dict[int, float] = {}
        self._read_chars: dict[int, float] = {}
        self._runqueue: dict[int, float] = {}
        self._pss: dict[str, float] = {}
        self._pss_read_at = -float("inf")

    def read(self, elapsed: float) -> dict[str, float]:
        workers = [process for process in self.workers() if process.is_running()]
        main_cpu, main_faults, main_read = self._deltas(self.main)
        worker_cpu = worker_faults = worker_rss = 0.0
        reads = [] if main_read is None else [main_read]
        alive: list[psutil.Process] = []
        for worker in workers:
            try:
                cpu, faults, read = self._deltas(worker)
                worker_rss += worker.memory_info().rss / _MB
            except psutil.Error:
                continue
            alive.append(worker)
            worker_cpu += cpu or 0.0
            worker_faults += faults or 0.0
            if read is not None:
                reads.append(read)
        self._forget_dead({self.main.pid, *(worker.pid for worker in alive)})
        values = {
            "loader_workers_alive": float(len(alive)),
            "main_rss_mb": self.main.memory_info().rss / _MB,
            "workers_rss_mb": worker_rss,
            **self._proportional_memory(alive),
        }
        waited, threads = _threads_runqueue_wait(self.main.pid)
        if threads:
            values["main_threads"] = float(threads)
        queued = None if waited is None else _change(self._runqueue, self.main.pid, waited)
        if queued is not None and elapsed > 0:
            values["main_runqueue_percent"] = 100.0 * queued / elapsed
        if main_cpu is not None and elapsed > 0:
            values["main_cpu_percent"] = 100.0 * main_cpu / elapsed
            values["workers_cpu_percent"] = 100.0 * worker_cpu / elapsed
            if alive:
                values["worker_cpu_percent_mean"] = values["workers_cpu_percent"] / len(alive)
        if main_faults is not None and elapsed > 0:
            values["major_faults_per_sec"] = (main_faults + worker_faults) / elapsed
        if reads and elapsed > 0:
            values["own_read_mbps"] = sum(reads) / _MB / elapsed
        return values

    def _proportional_memory(self, workers: list[psutil.Process]) -> dict[str, float]:
        now = time.monotonic()
        if now - self._pss_read_at >= self.pss_every:
            self._pss_read_at = now
            main = pss_mb(self.main.pid)
            pss = [value for worker in workers if (value := pss_mb(worker.pid)) is not None]
            self._pss = {}
            if main is not None:
                self._pss["main_pss_mb"] = main
                self._pss["workers_pss_mb"] = sum(pss)
        return self._pss

    def _deltas(self, process: psutil.Process) -> tuple[float | None, float | None, float | None]:
        """CPU seconds, major faults and bytes read (:func:`read_chars`) since this process's last reading;
        each ``None`` on the first reading or where it cannot be read."""
        times = process.cpu_times()
        cpu = _change(self._cpu_seconds, process.pid, times.user + times.system)
        faults, chars = major_faults(process.pid), read_chars(process)
        return (
            cpu,
            None if faults is None else _change(self._major_faults, process.pid, faults),
            None if chars is None else _change(self._read_chars, process.pid, chars),
        )

    def _forget_dead(self, alive: set[int]) -> None:
        for table in (self._cpu_seconds, self._major_faults, self._read_chars):
            for pid in [pid for pid in table if pid not in alive]:
                del table[pid]

    def close(self) -> None:
        pass


def _threads_runqueue_wait(pid: int) -> tuple[float | None, int]:
    """Seconds all of ``pid``'s threads (intra-op ones too) spent runnable but waiting for a CPU, and how many
    threads it has (Linux ``/proc/<pid>/task/*/schedstat``; ``(None, 0)`` elsewhere)."""
    total, threads = 0.0, 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None, 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as handle:
                total += int(handle.read().split()[1]) / 1e9
            threads += 1
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return (total, threads) if threads else (None, 0)


def _change(last_readings: dict[int, float], pid: int, now: float) -> float | None:
    """``now`` less ``pid``'s last reading in ``last_readings`` (never negative; ``None`` the first time),
    which ``now`` replaces."""
    last, last_readings[pid] = last_readings.get(pid), now
    return None if last is None else max(0.0, now - last)


def read_chars(process: psutil.Process) -> int | None:
    """Bytes ``process`` has read (``/proc/<pid>/io`` ``rchar``: every ``read()``, from files on any filesystem,
    NFS included, and the page cache; ``read_bytes``, where only it exists, would miss network filesystems);
    ``None`` where the counters cannot be read."""
    try:
        counters = process.io_counters()
    except (psutil.Error, AttributeError, OSError):
        return None
    chars = getattr(counters, "read_chars", None)  # Linux; elsewhere only read_bytes
    return counters.read_bytes if chars is None else chars


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
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
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
            self.devices = [name for name in counters if not name.startswith(("loop", "ram", "zram", "dm-", "sr"))]
        if not self.devices:
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
