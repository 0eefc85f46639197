"""A hang watchdog: say so when no batch arrives for a long time, and what the workers are doing; it never kills."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from lightning_dataperf.telemetry.processes import loader_worker_processes
from lightning_dataperf.telemetry.ticker import Ticker

__all__ = ["HangReport", "HangWatchdog", "WorkerState"]


@dataclass(frozen=True)
class WorkerState:
    """One loader worker at the time of a hang report."""

    pid: int
    status: str
    cpu_percent: float


@dataclass(frozen=True)
class HangReport:
    """What the watchdog saw when no batch had arrived for ``waited`` seconds."""

    waited: float
    last_batch_index: int | None
    workers: tuple[WorkerState, ...]

    def format(self) -> str:
        last = "none yet" if self.last_batch_index is None else str(self.last_batch_index)
        lines = [
            f"DataPerf watchdog: no batch from the loader for {self.waited:.0f} s "
            f"(last batch index delivered: {last}). Training is not interrupted."
        ]
        if not self.workers:
            lines.append("  no loader worker processes are alive (num_workers=0, or the workers died)")
        for worker in self.workers:
            lines.append(f"  worker pid {worker.pid}: {worker.status}, {worker.cpu_percent:.0f}% CPU")
        if self.workers and all(worker.cpu_percent < 5 for worker in self.workers):
            lines.append(
                "  all workers are idle: they may be blocked on I/O, a lock, or a deadlock after fork "
                "(py-spy dump --pid <pid> shows where)"
            )
        return "\n".join(lines)


class HangWatchdog:
    """Report when a fetch has been pending for longer than ``timeout`` seconds.

    Args:
        timeout: seconds without a batch before a report; repeated every ``timeout`` while it lasts.
        report: called with each :class:`HangReport` (from the watchdog's thread).
        workers: lists the loader worker processes (default: this process's children).
        poll: seconds between looks (default: a quarter of ``timeout``, at most 1 s).

    Example::

        watchdog = HangWatchdog(timeout=120.0, report=print)
        watchdog.start()
        watchdog.fetch_started()
        ...
        watchdog.batch_arrived(batch_index=17)
        watchdog.stop()
    """

    def __init__(
        self,
        timeout: float,
        report: Callable[[HangReport], None],
        workers: Callable[[], list[psutil.Process]] = loader_worker_processes,
        poll: float | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"HangWatchdog(timeout={timeout}) must be > 0 seconds.")
        self.timeout = timeout
        self.report = report
        self.workers = workers
        self.poll = poll if poll is not None else min(1.0, timeout / 4)
        self._ticker = Ticker("lightning_dataperf-watchdog", self.poll, lambda: self.check(time.monotonic()))
        # Written by the training thread only (one attribute store each, atomic under the GIL) ...
        self._waiting_since: float | None = None
        self._last_batch_index: int | None = None
        # ... and these by the watchdog thread only: no lock on the per-batch path.
        self._wait_seen: float | None = None
        self._next_report = 0.0

    @property
    def running(self) -> bool:
        return self._ticker.running

    def start(self) -> None:
        """Start looking, on the watchdog's own thread (no-op if running)."""
        self._ticker.start()

    def stop(self) -> None:
        """Stop and join the thread. Safe to call twice."""
        self._ticker.stop()

    def fetch_started(self) -> None:
        self._waiting_since = time.monotonic()

    def batch_arrived(self, batch_index: int | None = None) -> None:
        self._waiting_since = None
        if batch_index is not None:
            self._last_batch_index = batch_index

    def idle(self) -> None:
        """Not waiting for data (between epochs, validation, teardown)."""
        self.batch_arrived()

    def check(self, now: float) -> HangReport | None:
        # Read once: the training thread may clear it meanwhile.
        since = self._waiting_since
        if since is None:
            return None
        if since != self._wait_seen:  # a new wait: its first report is due ``timeout`` after it began
            self._wait_seen, self._next_report = since, since + self.timeout
        if now < self._next_report:
            return None
        # Repeated every timeout while the wait lasts, not at every poll.
        self._next_report = now + self.timeout
        waited, last = now - since, self._last_batch_index
        report = HangReport(waited, last, tuple(_worker_states(self.workers())))
        self.report(report)
        return report


def _worker_states(workers: list[psutil.Process]) -> list[WorkerState]:
    states = []
    for worker in workers:
        try:
            # A first cpu_percent() without an interval is always 0.0.
            states.append(WorkerState(worker.pid, worker.status(), worker.cpu_percent(interval=0.05)))
        except psutil.Error:
            continue
    return states
