"""Background system telemetry: GPU (NVML), CPU, loader workers, memory and disk, as interval means.

One :class:`SystemSampler` thread per process reads every source each ``interval`` seconds. Rates
(PCIe bytes, disk reads, page faults, CPU%) are deltas between two readings. A source that fails
(no GPU, no NVML, no permission, a restricted ``/proc``) is dropped with one warning; telemetry never
stops training. Keys are the ``System/...`` names logged to TensorBoard.

Example::

    sampler = SystemSampler(interval=1.0, cuda_device=0, data_path="/data")
    sampler.start()
    ...                                  # train
    print(sampler.window_means())        # {"System/gpu_util_percent": 97.0, ...}
    sampler.stop()
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from lightning_dataperf.hardware import block_device_of, shm_usage

__all__ = [
    "CpuSource",
    "DiskSource",
    "GpuSource",
    "MemorySource",
    "ProcessSource",
    "SystemSampler",
    "loader_worker_processes",
]

log = logging.getLogger(__name__)
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
    """One group of readings. ``read`` returns ``System/...`` values; rates need two reads."""

    name: str

    def read(self, elapsed: float) -> dict[str, float]: ...

    def close(self) -> None: ...


class _Means:
    """Running sums of readings, per key."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.counts[key] = self.counts.get(key, 0) + 1

    def means(self) -> dict[str, float]:
        return {key: total / self.counts[key] for key, total in self.sums.items()}


# ---------------------------------------------------------------------------------------- GPU
class GpuSource:
    """NVML readings of one GPU: utilisation, memory, PCIe RX/TX bytes/s, SM clock, power, slowdowns.

    PCIe rates are deltas of NVML's byte counters (``NVML_FI_DEV_PCIE_COUNT_RX/TX_BYTES``), which the
    driver refreshes lazily and which some platforms do not maintain: on the lent H200 they moved by
    about 1% of the bytes actually copied (``benchmarks/pcie_counters.py``). The copy figures that
    DataPerfCallback measures itself (``Time/Transfer``, ``Transfer/GBps``) do not depend on them.

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
        self.handle = _nvml_handle(nvml, device)
        self._pcie_fields = [nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]
        self._last_pcie: tuple[float, float] | None = None
        self._pcie_counters = True

    def read(self, elapsed: float) -> dict[str, float]:
        nvml, handle = self.nvml, self.handle
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        values = {
            "System/gpu_util_percent": float(utilization.gpu),
            "System/gpu_memory_util_percent": float(utilization.memory),
            "System/gpu_memory_used_MB": memory.used / _MB,
            "System/gpu_sm_clock_MHz": float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "System/gpu_power_W": nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
        }
        reasons = int(_clock_event_reasons(nvml, handle))
        values["System/gpu_slowdown"] = float(any(reasons & bit for bit in _SLOWDOWN_REASONS))
        values["System/gpu_power_capped"] = float(bool(reasons & _POWER_CAP))
        values["System/gpu_clock_event_reasons"] = float(reasons)
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
                    "System/gpu_pcie_rx_MBps": max(0.0, rx - previous[0]) / _MB / elapsed,
                    "System/gpu_pcie_tx_MBps": max(0.0, tx - previous[1]) / _MB / elapsed,
                }
        # Fallback: NVML's own 20 ms throughput sample, in KB/s.
        rx = self.nvml.nvmlDeviceGetPcieThroughput(self.handle, self.nvml.NVML_PCIE_UTIL_RX_BYTES)
        tx = self.nvml.nvmlDeviceGetPcieThroughput(self.handle, self.nvml.NVML_PCIE_UTIL_TX_BYTES)
        return {"System/gpu_pcie_rx_MBps": rx * 1e3 / _MB, "System/gpu_pcie_tx_MBps": tx * 1e3 / _MB}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def _nvml_handle(nvml: Any, device: int) -> Any:
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
    """Per-core %user, %system and %iowait (mean and max across cores) and overall busy %."""

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
            values[f"System/cpu_{key}_percent_mean"] = sum(column) / len(column)
            values[f"System/cpu_{key}_percent_max"] = max(column)
        if (runnable := _runnable_tasks()) is not None:
            values["System/runnable_tasks"] = runnable
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
def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid``: from ``/proc/<pid>/task/*/children`` (cheap), else psutil's full scan."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        files = list(tasks.glob("*/children"))
    except OSError:
        files = []
    if not files:
        try:
            return [child.pid for child in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    children: list[int] = []
    for file in files:
        try:
            children.extend(int(token) for token in file.read_text().split())
        except (OSError, ValueError):
            continue
    return children


def loader_worker_processes(main: psutil.Process | None = None) -> list[psutil.Process]:
    """Child processes of this one that are DataLoader workers (other Lightning ranks excluded).

    Lightning's subprocess launcher starts ranks 1..N-1 as children of rank 0 with their own
    ``LOCAL_RANK``; workers inherit this process's environment, so they are told apart by it.
    """
    main = main or psutil.Process()
    own_rank = os.environ.get("LOCAL_RANK")
    workers: list[psutil.Process] = []
    for pid in child_pids(main.pid):
        try:
            child = _process(pid)
            if _local_rank(child) != own_rank:
                continue
        except psutil.Error:
            continue
        workers.append(child)
        workers.extend(loader_worker_processes(child))
    return workers


_PROCESSES: dict[int, tuple[psutil.Process, str | None]] = {}


def _process(pid: int) -> psutil.Process:
    """A cached ``psutil.Process`` (so CPU-time deltas and pid-reuse checks work across readings)."""
    cached = _PROCESSES.get(pid)
    if cached is not None and cached[0].is_running():
        return cached[0]
    process = psutil.Process(pid)
    try:
        rank = process.environ().get("LOCAL_RANK")
    except psutil.Error:
        rank = os.environ.get("LOCAL_RANK")
    if len(_PROCESSES) > 4096:
        _PROCESSES.clear()
    _PROCESSES[pid] = (process, rank)
    return process


def _local_rank(process: psutil.Process) -> str | None:
    return _PROCESSES[process.pid][1]


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
        self._major_faults: dict[int, int] = {}
        self._pss: dict[str, float] = {}
        self._pss_read_at = -float("inf")

    def read(self, elapsed: float) -> dict[str, float]:
        workers = [process for process in self.workers() if process.is_running()]
        main_cpu, main_faults = self._deltas(self.main)
        worker_cpu = worker_faults = worker_rss = 0.0
        alive: list[psutil.Process] = []
        for worker in workers:
            try:
                cpu, faults = self._deltas(worker)
                worker_rss += worker.memory_info().rss / _MB
            except psutil.Error:
                continue
            alive.append(worker)
            worker_cpu += cpu or 0.0
            worker_faults += faults or 0.0
        self._forget_dead({self.main.pid, *(worker.pid for worker in alive)})
        values = {
            "System/loader_workers_alive": float(len(alive)),
            "System/main_rss_MB": self.main.memory_info().rss / _MB,
            "System/workers_rss_MB": worker_rss,
            **self._proportional_memory(alive),
        }
        if main_cpu is not None and elapsed > 0:
            values["System/main_cpu_percent"] = 100.0 * main_cpu / elapsed
            values["System/workers_cpu_percent"] = 100.0 * worker_cpu / elapsed
            if alive:
                values["System/worker_cpu_percent_mean"] = values["System/workers_cpu_percent"] / len(alive)
        if main_faults is not None and elapsed > 0:
            values["System/major_faults_per_sec"] = (main_faults + worker_faults) / elapsed
        return values

    def _proportional_memory(self, workers: list[psutil.Process]) -> dict[str, float]:
        now = time.monotonic()
        if now - self._pss_read_at >= self.pss_every:
            self._pss_read_at = now
            main = _pss_mb(self.main.pid)
            pss = [value for worker in workers if (value := _pss_mb(worker.pid)) is not None]
            self._pss = {}
            if main is not None:
                self._pss["System/main_pss_MB"] = main
                self._pss["System/workers_pss_MB"] = sum(pss)
        return self._pss

    def _deltas(self, process: psutil.Process) -> tuple[float | None, float | None]:
        times = process.cpu_times()
        seconds = times.user + times.system
        faults = _major_faults(process.pid)
        last_seconds = self._cpu_seconds.get(process.pid)
        last_faults = self._major_faults.get(process.pid)
        self._cpu_seconds[process.pid] = seconds
        cpu = None if last_seconds is None else max(0.0, seconds - last_seconds)
        if faults is None:
            return cpu, None
        self._major_faults[process.pid] = faults
        return cpu, (None if last_faults is None else float(max(0, faults - last_faults)))

    def _forget_dead(self, alive: set[int]) -> None:
        for table in (self._cpu_seconds, self._major_faults):
            for pid in [pid for pid in table if pid not in alive]:
                del table[pid]

    def close(self) -> None:
        pass


def _major_faults(pid: int) -> int | None:
    """``majflt`` from ``/proc/<pid>/stat`` (Linux); ``None`` elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[9])


def _pss_mb(pid: int) -> float | None:
    """Proportional set size from ``/proc/<pid>/smaps_rollup`` (Linux 4.14+), ``None`` where unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# ---------------------------------------------------------------------------------------- memory
class MemorySource:
    """Available RAM, swap, ``/dev/shm`` used and free, pinned host memory held by PyTorch."""

    name = "memory"

    def read(self, elapsed: float) -> dict[str, float]:
        values = {
            "System/ram_available_MB": psutil.virtual_memory().available / _MB,
            "System/swap_used_MB": psutil.swap_memory().used / _MB,
        }
        if (shm := shm_usage()) is not None:
            values["System/shm_used_MB"] = shm[0] - shm[1]
            values["System/shm_free_MB"] = shm[1]
        if (pinned := pinned_host_mb()) is not None:
            values["System/pinned_host_MB"] = pinned
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
            "System/disk_read_MBps": read_bytes / _MB / elapsed,
            "System/disk_read_iops": reads / elapsed,
            "System/disk_await_ms": io_ms / io_count if io_count else 0.0,
            "System/disk_util_percent": util,
        }

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------- sampler
SourceFactory = Callable[[], Source]


def default_sources(cuda_device: int | None, data_path: str | os.PathLike[str] | None) -> list[SourceFactory]:
    """The factories of every source that applies to this process."""
    factories: list[SourceFactory] = [CpuSource, ProcessSource, MemorySource, lambda: DiskSource(data_path)]
    if cuda_device is not None:
        factories.insert(0, lambda: GpuSource(cuda_device))
    return factories


class SystemSampler:
    """One daemon thread that samples every source each ``interval`` seconds.

    ``window_means()`` returns means since its last call (the logging cadence) and
    ``epoch_means()`` since ``reset_epoch()``; the latter takes one fresh reading first, so even an
    epoch shorter than the interval has figures. ``on_tick`` callables (the hang watchdog) run on the same
    thread after each reading.

    Args:
        interval: seconds between readings.
        cuda_device: this rank's CUDA device index, or ``None`` for no GPU telemetry.
        data_path: dataset location, to pick the disk to watch.
        sources: source factories (default: :func:`default_sources`); tests pass fakes.

    Example::

        sampler = SystemSampler(interval=0.5, cuda_device=0)
        sampler.start()
        ...
        print(sampler.epoch_means()["System/gpu_util_percent"])
        sampler.stop()
    """

    def __init__(
        self,
        interval: float = 1.0,
        cuda_device: int | None = None,
        data_path: str | os.PathLike[str] | None = None,
        sources: Iterable[SourceFactory] | None = None,
        on_tick: Iterable[Callable[[float], None]] = (),
    ) -> None:
        if interval <= 0:
            raise ValueError(f"SystemSampler(interval={interval}) must be > 0 seconds.")
        self.interval = interval
        self.on_tick = list(on_tick)
        self.unavailable: dict[str, str] = {}
        self._factories = list(sources) if sources is not None else default_sources(cuda_device, data_path)
        self._sources: list[Source] = []
        self._read_lock = threading.Lock()  # one reader of the sources at a time (their deltas are stateful)
        self._lock = threading.Lock()  # the accumulators: held only for microseconds, never during a read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window = _Means()
        self._epoch = _Means()
        self._last_read = time.monotonic()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Open the sources and start the thread (no-op if already running)."""
        if self.running:
            return
        self._stop.clear()
        self._sources = [source for factory in self._factories if (source := self._open(factory)) is not None]
        self._last_read = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="lightning_dataperf-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread and close the sources. Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval))
            self._thread = None
        with self._read_lock:
            for source in self._sources:
                source.close()
            self._sources = []

    def window_means(self) -> dict[str, float]:
        """Means of the readings since the last call (no reading of its own: cheap at every log point)."""
        with self._lock:
            means, self._window = self._window.means(), _Means()
        return means

    def epoch_means(self) -> dict[str, float]:
        """Means since :meth:`reset_epoch`, with one fresh reading first unless the last one is recent."""
        with self._read_lock:
            with self._lock:
                stale = not self._epoch.counts or time.monotonic() - self._last_read >= 0.25 * self.interval
            if stale and self._sources:
                self._sample()
        with self._lock:
            return self._epoch.means()

    def reset_epoch(self) -> None:
        with self._lock:
            self._epoch = _Means()

    def _open(self, factory: SourceFactory) -> Source | None:
        try:
            return factory()
        except Exception as error:
            self._disable(getattr(factory, "name", getattr(factory, "__name__", "source")), error)
            return None

    def _disable(self, name: str, error: BaseException) -> None:
        self.unavailable[name] = f"{type(error).__name__}: {error}"
        warnings.warn(
            f"DataPerf telemetry: {name} metrics are not available here and will be absent ({error}). "
            "Training is not affected.",
            stacklevel=3,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._read_lock:
                self._sample()
            now = time.monotonic()
            for tick in self.on_tick:
                try:
                    tick(now)
                except Exception:
                    log.exception("DataPerf sampler tick failed")

    def _sample(self) -> None:
        """Read every source (caller holds the read lock), then add the values under the data lock."""
        now = time.monotonic()
        elapsed, self._last_read = now - self._last_read, now
        values: dict[str, float] = {}
        for source in list(self._sources):
            try:
                values.update(source.read(elapsed))
            except Exception as error:
                self._sources.remove(source)
                source.close()
                self._disable(source.name, error)
        with self._lock:
            self._window.add(values)
            self._epoch.add(values)
