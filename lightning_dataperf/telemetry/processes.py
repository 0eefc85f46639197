"""This process's loader workers (other Lightning ranks told apart) and per-process counters (telemetry, watchdog).

Example::

    for worker in loader_worker_processes():
        print(worker.pid, worker.status())
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

__all__ = ["child_pids", "is_shm_manager", "loader_worker_processes", "major_faults", "pss_mb"]

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
    if cached is not None and cached[0].is_running():
        return cached[0]
    process = psutil.Process(pid)
    try:
        rank = process.environ().get("LOCAL_RANK")
    except psutil.Error:
        rank = os.environ.get("LOCAL_RANK")
    try:
        helper = any(_RESOURCE_TRACKER in part for part in process.cmdline())
    except psutil.Error:
        helper = False
    if len(_PROCESSES) > 4096:
        _PROCESSES.clear()
    _PROCESSES[pid] = (process, rank, helper)
    return process


def _local_rank(process: psutil.Process) -> str | None:
    return _PROCESSES[process.pid][1]


def _helper(process: psutil.Process) -> bool:
    """Whether ``process`` is ``multiprocessing``'s resource tracker (read once per process, with its rank)."""
    return _PROCESSES[process.pid][2]


def major_faults(pid: int) -> int | None:
    """``majflt`` from ``/proc/<pid>/stat`` (Linux); ``None`` elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
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
