"""This process's loader workers (other Lightning ranks told apart) and per-process counters (telemetry, watchdog).

Example::

    for worker in loader_worker_processes():
        print(worker.pid, worker.status())
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

__all__ = [
    "ProcessSource",
    "child_pids",
    "is_shm_manager",
    "loader_worker_processes",
    "major_faults",
    "pss_mb",
    "read_chars",
    "runs_this_interpreter",
    "threads_runqueue_wait",
]

_MB = 2**20

#: PyTorch's shared-memory manager (``file_system`` sharing, see :mod:`~lightning_dataperf.loader.sharing`) is a child
#: process of the one that started it, not a worker; its name as ``/proc`` cuts it (15 characters).
_SHM_MANAGER = "torch_shm_manag"
#: The ``multiprocessing`` resource tracker (started once a spawn or forkserver context makes a lock or shared
#: memory, then alive as long as the process): a sleeping child that is not a worker either.
_RESOURCE_TRACKER = "multiprocessing.resource_tracker"


def is_shm_manager(process: psutil.Process) -> bool:
    """Whether ``process`` is PyTorch's ``torch_shm_manager`` (never counted as a loader worker)."""
    try:
        return process.name().startswith(_SHM_MANAGER)
    except psutil.Error:
        return False


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid``: from ``/proc/<pid>/task/*/children`` (cheap), else psutil's full scan."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        # Each thread lists the children it forked, so every thread's file is read.
        files = list(tasks.glob("*/children"))
    except OSError:
        files = []
    # The children files exist only in kernels built with CONFIG_PROC_CHILDREN.
    if not files:
        try:
            return [child.pid for child in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    children: list[int] = []
    for file in files:
        try:
            # A thread that ended after the glob has no file left to read.
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
            # A child can exit between the listing and the reading.
            child = _process(pid)
            if _local_rank(child) != own_rank or is_shm_manager(child) or _helper(child):
                continue
        except psutil.Error:
            continue
        workers.append(child)
        workers.extend(loader_worker_processes(child))
    return workers


_PROCESSES: dict[int, tuple[psutil.Process, str | None, bool]] = {}


def _process(pid: int) -> psutil.Process:
    """A cached ``psutil.Process`` (so CPU-time deltas and pid-reuse checks work across readings)."""
    cached = _PROCESSES.get(pid)
    # is_running() also catches a reused pid, whose cached rank and kind would be stale.
    if cached is not None and cached[0].is_running():
        return cached[0]
    process = psutil.Process(pid)
    try:
        rank = process.environ().get("LOCAL_RANK")
    except psutil.Error:
        rank = os.environ.get("LOCAL_RANK")
    try:
        helper = not runs_this_interpreter(process) or any(_RESOURCE_TRACKER in part for part in process.cmdline())
    except psutil.Error:
        helper = False
    # Bounded: the pids of exited workers would otherwise pile up over a long run.
    if len(_PROCESSES) > 4096:
        _PROCESSES.clear()
    _PROCESSES[pid] = (process, rank, helper)
    return process


# The interpreter does not change for the life of the process.
@functools.cache
def _own_exe() -> str:
    try:
        return psutil.Process().exe()
    except psutil.Error:
        return ""


def runs_this_interpreter(process: psutil.Process) -> bool:
    """Whether ``process`` runs this Python (as workers do, forked or spawned), not another program: mpi4py's
    ``MPI_Init``, which Lightning's MPI detection calls where mpi4py is installed, starts ``orted`` as a child."""
    own = _own_exe()
    try:
        return not own or process.exe() == own
    except psutil.Error:
        return True


def _local_rank(process: psutil.Process) -> str | None:
    return _PROCESSES[process.pid][1]


def _helper(process: psutil.Process) -> bool:
    """Whether ``process`` is ``multiprocessing``'s resource tracker or another program (read once, with its rank)."""
    return _PROCESSES[process.pid][2]


def major_faults(pid: int) -> int | None:
    """``majflt`` from ``/proc/<pid>/stat`` (Linux); ``None`` elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may hold spaces or ")", so split after the last ")".
    fields = stat.rsplit(")", 1)[1].split()
    # majflt is field 12 of proc(5); fields[0] is field 3 (state).
    return int(fields[9])


def pss_mb(pid: int) -> float | None:
    """Proportional set size from ``/proc/<pid>/smaps_rollup`` (Linux 4.14+), ``None`` where unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


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
        # So that the first reading reads PSS at once.
        self._pss_read_at = -float("inf")

    def read(self, elapsed: float) -> dict[str, float]:
        workers = [process for process in self.workers() if process.is_running()]
        main_cpu, main_faults, main_read = self._deltas(self.main)
        worker_cpu = worker_faults = worker_rss = 0.0
        reads = [] if main_read is None else [main_read]
        alive: list[psutil.Process] = []
        for worker in workers:
            try:
                # A worker can exit between the listing and its reading.
                cpu, faults, read = self._deltas(worker)
                worker_rss += worker.memory_info().rss / _MB
            except psutil.Error:
                continue
            alive.append(worker)
            worker_cpu += cpu or 0.0
            worker_faults += faults or 0.0
            if read is not None:
                reads.append(read)
        # A reused pid must not inherit an exited worker's baseline.
        self._forget_dead({self.main.pid, *(worker.pid for worker in alive)})
        values = {
            "loader_workers_alive": float(len(alive)),
            "main_rss_mb": self.main.memory_info().rss / _MB,
            "workers_rss_mb": worker_rss,
            **self._proportional_memory(alive),
        }
        waited, threads = threads_runqueue_wait(self.main.pid)
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
            # Without smaps_rollup (before Linux 4.14), no PSS figure rather than a partial one.
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


def threads_runqueue_wait(pid: int) -> tuple[float | None, int]:
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
