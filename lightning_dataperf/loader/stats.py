"""What the loader's inside looked like over a window or an epoch: the means of its batches' timings."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_dataperf import tags

__all__ = ["LoaderStats"]


@dataclass(frozen=True)
class LoaderStats:
    """Per-batch means (seconds) of one loader's batches, and its workers' busy fraction.

    Attributes:
        batches: batches the figures cover.
        samples: mean samples per batch.
        fetch_s: time in the dataset's ``__getitem__``/``__getitems__`` per batch (in the worker).
        work_cpu_s: the worker thread's CPU time in the fetch and collate per batch (the rest was waiting).
        collate_s: time in ``collate_fn`` per batch (in the worker).
        pin_s: time in the pin thread per batch.
        worker_wait_s: per batch, how long the training process waited for a batch still being made.
        handover_s: per batch, how long it waited after the batch was ready (queue, unpickling).
        wait_s: the training process's whole wait in the loader's iterator per batch.
        workers: distinct workers seen (0: batches made in the training process).
        busy_fraction: the workers' mean fetch + collate time over wall time (``None`` without workers).
        busy_min / busy_max: the least and most busy worker.

    Example::

        stats = LoaderStats.of(probe.completed())
        stats.busy_fraction          # 0.97: the workers are working 97% of the time
        stats.to_metrics()           # {"Workers/fetch_s": 0.21, ...}
    """

    batches: int
    samples: float
    fetch_s: float
    collate_s: float
    pin_s: float
    worker_wait_s: float
    handover_s: float
    wait_s: float
    workers: int
    busy_fraction: float | None = None
    busy_min: float | None = None
    busy_max: float | None = None
    work_cpu_s: float = 0.0

    @property
    def cpu_fraction(self) -> float | None:
        """CPU over wall time of the workers' fetch + collate: ~1 computing, ~0 waiting (I/O, sleeps).

        Lower than 1 also when computing workers time-share too few cores. ``None`` when not measured.
        """
        # Zero CPU time means not measured (a record without it), not a worker that never computed.
        return self.work_cpu_s / self.work_s if self.work_s > 0 and self.work_cpu_s > 0 else None

    @property
    def work_s(self) -> float:
        """A worker's time on one batch: fetch + collate."""
        return self.fetch_s + self.collate_s

    @property
    def fetch_share(self) -> float:
        """Share of the workers' time spent in the dataset (read, decode, augment) rather than the collate."""
        return self.fetch_s / self.work_s if self.work_s > 0 else 0.0

    @classmethod
    def of(cls, records: Sequence[Any]) -> LoaderStats | None:
        """From :class:`~lightning_dataperf.loader.probe.BatchTiming` records; ``None`` for none."""
        if not records:
            return None
        count = len(records)

        def mean(attribute: str) -> float:
            return sum(getattr(record, attribute) for record in records) / count

        by_worker: dict[tuple[int, int], list[Any]] = defaultdict(list)  # (pid, id): loaders' workers apart
        for record in records:
            by_worker[(getattr(record, "pid", 0), record.worker)].append(record)
        # Worker -1 is the training process itself (num_workers=0), no worker to be busy.
        busy = [_busy_fraction(own) for (_, worker), own in by_worker.items() if worker >= 0]
        return cls(
            batches=count,
            samples=mean("samples"),
            fetch_s=mean("fetch_s"),
            collate_s=mean("collate_s"),
            pin_s=mean("pin_s"),
            worker_wait_s=mean("worker_wait_s"),
            handover_s=mean("handover_s"),
            wait_s=mean("wait_s"),
            workers=len([key for key in by_worker if key[1] >= 0]),
            busy_fraction=sum(busy) / len(busy) if busy else None,
            busy_min=min(busy) if busy else None,
            busy_max=max(busy) if busy else None,
            work_cpu_s=mean("work_cpu_s"),
        )

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        """The ``Workers/...`` scalars; the hand-over, busy and CPU shares only where workers made the batches."""
        metrics = {
            tags.WORKERS_FETCH_S: self.fetch_s,
            tags.WORKERS_COLLATE_S: self.collate_s,
            tags.WORKERS_PIN_S: self.pin_s,
        }
        # Without workers there is no hand-over and no worker to be busy.
        if self.workers:
            metrics.update({tags.WORKERS_WAIT_S: self.worker_wait_s, tags.WORKERS_HANDOVER_S: self.handover_s})
            if self.busy_fraction is not None:
                metrics[tags.WORKERS_BUSY] = self.busy_fraction
            if (ratio := self.cpu_fraction) is not None:
                metrics[tags.WORKERS_CPU] = ratio
        return {prefix + tag: value for tag, value in metrics.items()}

    def format(self) -> str:
        where = f"{self.workers} workers" if self.workers else "the training process (num_workers=0)"
        text = f"loader per batch: fetch {1e3 * self.fetch_s:.2f} ms + collate {1e3 * self.collate_s:.2f} ms in {where}"
        if self.pin_s > 0:
            text += f", pin {1e3 * self.pin_s:.2f} ms"
        text += f"; wait {1e3 * self.wait_s:.2f} ms"
        if self.workers:
            text += f" = for the worker {1e3 * self.worker_wait_s:.2f} + hand-over {1e3 * self.handover_s:.2f}"
        else:  # no worker, no hand-over: the wait is the loading itself
            text += " (the loading itself, in this process)"
        if self.busy_fraction is not None:
            text += f"; workers {100 * self.busy_fraction:.0f}% busy"
        return text


def _busy_fraction(records: list[Any]) -> float:
    """One worker's busy share between its first and last batch here (since its first fetch for one batch)."""
    records = sorted(records, key=lambda record: record.produced_at)
    first, last = records[0], records[-1]
    # busy_s and alive_s count from the worker's first fetch: the window's share is their difference.
    if len(records) > 1 and last.alive_s > first.alive_s:
        return min(1.0, (last.busy_s - first.busy_s) / (last.alive_s - first.alive_s))
    return min(1.0, last.busy_s / last.alive_s) if last.alive_s > 0 else 1.0
