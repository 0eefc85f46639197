"""What the machine can give one search: the memory guard and the most workers each resource allows."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from lightning_dataperf.autotune.measures import open_files
from lightning_dataperf.autotune.trial import CPU_OVERSUBSCRIPTION, FD_SHARE, Trial
from lightning_dataperf.loader.preflight import open_file_limit, pinned_bytes
from lightning_dataperf.telemetry.hardware import Hardware

__all__ = ["Resources", "bounds_text", "tightest"]

_MB = 2**20
#: The smallest busy share the CPU-share bound divides by (a worker that hardly computes still has a process).
MIN_BUSY = 0.02
#: More workers whose CPU time together grew by less than this share: the CPUs they can get are spent.
CPU_PLATEAU = 0.1


@dataclasses.dataclass
class Resources:
    """The machine's limits for one search, and the batch they are counted in.

    Example::

        resources = Resources(probe_hardware(), memory_fraction=0.5, batches_per_epoch=1000)
        resources.learn(BatchFootprint.of(batch).bytes, tensors=2)
        resources.refusal(64, 8, True)          # None, or why it would not fit
        resources.worker_bounds(2, True, trials)  # {"/dev/shm": 410, "CPU share": 33, ...}
    """

    hardware: Hardware
    memory_fraction: float
    batches_per_epoch: int | None = None
    batch_bytes: int | None = None  # learnt from the first batch (:meth:`learn`)
    batch_tensors: int = 1

    def learn(self, batch_bytes: int, tensors: int) -> None:
        self.batch_bytes, self.batch_tensors = batch_bytes, max(1, tensors)

    # ------------------------------------------------------------------ the memory guard
    def memory_mb(self, workers: int, prefetch: int | None, pin: bool) -> float:
        """The batches in flight (``workers x prefetch`` and the one in hand), and their pinned copies."""
        if self.batch_bytes is None:
            return 0.0
        in_flight = workers * (prefetch or 0) + 1
        pinned = pinned_bytes(self.batch_bytes, in_flight + 1) if pin else 0
        return (self.batch_bytes * in_flight + pinned) / _MB

    def refusal(self, workers: int, prefetch: int | None, pin: bool) -> str | None:
        """Why the configuration's batches in flight would not fit in ``memory_fraction`` of free memory, or None."""
        need = self.memory_mb(workers, prefetch, pin)
        free = [self.hardware.ram_available_mb]
        if workers and self.hardware.shm_free_mb is not None:
            free.append(self.hardware.shm_free_mb)
        if need > self.memory_fraction * min(free):
            return f"needs ~{need:.0f} MB of /dev/shm and pinned RAM, over {100 * self.memory_fraction:.0f}% of free"
        return None

    def affordable(self, config: tuple[int, int | None, bool]) -> tuple[int, int | None, bool]:
        """``config``, or the nearest one with fewer workers / less prefetch that the memory guard accepts."""
        workers, prefetch, pin = config
        while workers and self.refusal(workers, prefetch, pin) is not None:
            if prefetch and prefetch > 1:
                prefetch //= 2
            else:
                workers //= 2
        return workers, (prefetch if workers else None), pin

    # ------------------------------------------------------------------ the bounds
    def worker_bounds(self, prefetch: int | None, pin: bool, trials: Iterable[Trial]) -> dict[str, int]:
        """The most workers each resource allows at this prefetch, from what ``trials`` measured.

        * ``"/dev/shm"``: batches in flight (workers x prefetch) within ``memory_fraction`` of the free space;
        * ``"memory"``: each worker's own memory (the most any trial measured) plus its batches in flight
          within ``memory_fraction`` of the available RAM;
        * ``"file descriptors"``: a worker's queues and shared tensors within half the free descriptors;
        * ``"CPU share"``: twice the rank's CPUs over a worker's busy share: the share at the most workers
          measured, the nearest to what more workers would each use, unless the workers' CPU time together
          stopped growing between the two highest counts (within :data:`CPU_PLATEAU`): then more workers only
          split the CPUs they can get, and the busiest share measured is read;
        * ``"dataset"``: no more workers than batches in one epoch.

        The busiest share alone bounds a latency loader too early; the share at the most workers alone never
        binds a CPU-bound climb (``workers x share`` cannot pass the CPUs).
        """
        prefetch = prefetch or 2
        fraction = self.memory_fraction
        batch_mb = (self.batch_bytes or 0) / _MB
        bounds: dict[str, int] = {}
        if batch_mb > 0 and self.hardware.shm_free_mb is not None:
            pinned_mb = pinned_bytes(self.batch_bytes or 0, 1) / _MB if pin else 0.0
            shm = fraction * min(self.hardware.shm_free_mb, self.hardware.ram_available_mb)
            bounds["/dev/shm"] = max(0, int((shm / (batch_mb + pinned_mb) - 2) // prefetch))
        measured = [trial for trial in trials if trial.refused is None]
        worker_mb = [trial.worker_mb for trial in measured if trial.worker_mb is not None]
        if worker_mb and self.hardware.ram_available_mb:
            per_worker = max(worker_mb) + batch_mb * prefetch
            bounds["memory"] = max(1, int(fraction * self.hardware.ram_available_mb // max(per_worker, 1e-3)))
        limit = open_file_limit()
        if limit is not None:
            free = limit - open_files()
            per_worker = 6 + 2 * prefetch * self.batch_tensors
            bounds["file descriptors"] = max(1, int(FD_SHARE * free // per_worker))
        if (share := _busy_share(measured)) is not None:
            bounds["CPU share"] = max(1, math.floor(CPU_OVERSUBSCRIPTION * self.hardware.cpus_per_rank / share))
        if self.batches_per_epoch:
            bounds["dataset"] = max(1, self.batches_per_epoch)
        return bounds


def _busy_share(trials: list[Trial]) -> float | None:
    """The busy share the CPU-share bound reads (see :meth:`Resources.worker_bounds`), at least :data:`MIN_BUSY`."""
    by_count: dict[int, float] = {}
    for trial in trials:
        if trial.worker_busy is not None and trial.num_workers:
            by_count[trial.num_workers] = max(trial.worker_busy, by_count.get(trial.num_workers, 0.0))
    if not by_count:
        return None
    counts = sorted(by_count)
    share = by_count[counts[-1]]
    if len(counts) > 1:
        fewer, most = counts[-2], counts[-1]
        if most * by_count[most] <= fewer * by_count[fewer] * (1 + CPU_PLATEAU):  # the workers' CPU stopped growing
            share = max(by_count.values())
    return max(share, MIN_BUSY)


def tightest(bounds: Mapping[str, int]) -> tuple[str, float]:
    """The bound that allows the fewest workers and its count; ``("", inf)`` without bounds."""
    return min(bounds.items(), key=lambda item: item[1]) if bounds else ("", math.inf)


def bounds_text(bounds: Mapping[str, int]) -> str:
    """Every bound, tightest first: ``"CPU share 42, memory 130"``."""
    return ", ".join(f"{name} {value}" for name, value in sorted(bounds.items(), key=lambda item: item[1]))
