"""Inside the loader: where a batch's time goes before the training process gets it (docs/loader.md, section 2)."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

__all__ = ["BatchTiming", "LoaderProbe", "TimedBatch", "instrument", "uninstrument", "untimed"]

_now = time.perf_counter  # CLOCK_MONOTONIC on Linux: comparable between the workers and the main process
_cpu = time.thread_time  # this thread's CPU time: what the fetch computed, apart from what it waited
#: Records kept when nobody reads them (bounded so that they cannot pile up).
MAX_RECORDS = 65536


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """One batch, as its worker made it and the training process received it (seconds).

    Attributes:
        worker: the worker's id, or -1 for the main process (``num_workers=0``); ``pid`` its process.
        samples: samples fetched for the batch.
        fetch_s: time in the dataset's ``__getitem__``/``__getitems__`` for this batch.
        work_cpu_s: CPU time the worker's thread spent from the batch's first fetch to the end of its collate
            (far below their time when it waited); two thread-clock reads per batch, not one pair per call.
        collate_s: time in ``collate_fn``.
        busy_s / alive_s: the worker's fetch + collate time so far, and its wall time since its first fetch.
        produced_at: when the collate ended (``perf_counter``).
        pin_s: time in the pin thread (0 without ``pin_memory``).
        requested_at / received_at: when the training process asked the iterator for it, and got it.
        index: the batch's position in its epoch's iterator (the step it feeds).
    """

    worker: int
    samples: int
    fetch_s: float
    collate_s: float
    busy_s: float
    alive_s: float
    produced_at: float
    work_cpu_s: float = 0.0
    pin_s: float = 0.0
    requested_at: float = 0.0
    received_at: float = 0.0
    index: int = -1
    pid: int = 0

    @property
    def ready_at(self) -> float:
        return self.produced_at + self.pin_s

    @property
    def worker_wait_s(self) -> float:
        """The part of the training process's wait during which the batch was still being made (or pinned)."""
        # A batch ready before it was asked for cost no wait for the worker.
        return max(0.0, min(self.ready_at, self.received_at) - self.requested_at)

    @property
    def handover_s(self) -> float:
        """The part of the wait after the batch was ready: queue, unpickling, bookkeeping."""
        return max(0.0, self.received_at - max(self.ready_at, self.requested_at))

    @property
    def wait_s(self) -> float:
        return max(0.0, self.received_at - self.requested_at)


class _WorkerClock:
    """Per process (each worker has its own copy): fetch time of the batch in progress, and busy time."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.first_fetch: float | None = None
        self.fetch = 0.0
        self.cpu_mark: float | None = None  # the thread's CPU time when the batch in progress began
        self.samples = 0
        self.busy = 0.0

    def fetch_starting(self) -> None:
        if self.cpu_mark is None:  # the batch's first fetch (thread_time is a system call: once per batch)
            self.cpu_mark = _cpu()

    def fetched(self, started: float, ended: float, samples: int) -> None:
        if self.first_fetch is None:
            self.first_fetch = started
        self.fetch += ended - started
        self.samples += samples

    def batch_done(self, collate_s: float, work_cpu: float, ended: float) -> BatchTiming:
        fetch, samples = self.fetch, self.samples
        self.fetch, self.samples, self.cpu_mark = 0.0, 0, None
        self.busy += fetch + collate_s
        first = self.first_fetch if self.first_fetch is not None else ended - collate_s
        info = get_worker_info()
        worker = -1 if info is None else info.id
        return BatchTiming(worker, samples, fetch, collate_s, self.busy, ended - first, ended, work_cpu, pid=self.pid)


_CLOCK: _WorkerClock | None = None


def _clock() -> _WorkerClock:
    """This process's clock (a forked worker's copy is dropped at the fork: no ``getpid()`` per batch)."""
    global _CLOCK  # noqa: PLW0603  (one per process)
    if _CLOCK is None:
        _CLOCK = _WorkerClock()
    return _CLOCK


def _forget_clock() -> None:
    global _CLOCK  # noqa: PLW0603
    _CLOCK = None


if hasattr(os, "register_at_fork"):  # a spawned or forkserver worker imports this module afresh
    os.register_at_fork(after_in_child=_forget_clock)


class TimedDataset(Dataset):
    """The user's map-style dataset, with the time of each ``__getitem__``/``__getitems__`` counted."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __getitem__(self, index: Any) -> Any:
        clock = _clock()
        clock.fetch_starting()
        started = _now()
        try:
            return self.dataset[index]
        finally:
            clock.fetched(started, _now(), 1)

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        clock = _clock()
        clock.fetch_starting()
        started = _now()
        try:
            many = getattr(self.dataset, "__getitems__", None)
            return many(indices) if many else [self.dataset[index] for index in indices]
        finally:
            clock.fetched(started, _now(), len(indices))

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # set_epoch, attributes the user's code reads
        # Looked up before __init__ has run (unpickling in a spawned worker), these would recurse forever.
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:  # e.g. a worker_init_fn opening a handle
        if name == "dataset" or name.startswith(("_dataperf", "__")):  # ours, or the wrapper's own class
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)


@dataclass(frozen=True, slots=True)
class TimedBatch:
    """A batch and its :class:`BatchTiming`, on the way from a worker to the training process.

    ``pin_s`` is the pin thread's time, folded into the timing when the callback reads it (not per batch).
    """

    batch: Any
    timing: BatchTiming
    pin_s: float = 0.0

    def pin_memory(self, device: Any = None) -> TimedBatch:
        """Called by the DataLoader's pin thread: pin the batch and count the time."""
        from lightning_dataperf._lightning_hooks import pin_batch  # the pin thread, in the training process

        started = _now()
        pinned = pin_batch(self.batch)
        return TimedBatch(pinned, self.timing, _now() - started)


class TimedCollate:
    """The user's ``collate_fn``, timed, returning a :class:`TimedBatch`."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> TimedBatch:
        clock = _clock()
        cpu = clock.cpu_mark if clock.cpu_mark is not None else _cpu()  # from the batch's first fetch
        started = _now()
        batch = self.collate_fn(samples)
        ended = _now()
        return TimedBatch(batch, clock.batch_done(ended - started, _cpu() - cpu, ended))


#: What the main process notes per batch: (timing, pin_s, requested_at, received_at, index).
_Received = tuple[BatchTiming, float, float, float, int]


class LoaderProbe:
    """Where the main process leaves each received batch's timing, until the callback drains them."""

    def __init__(self) -> None:
        self.records: deque[_Received] = deque(maxlen=MAX_RECORDS)
        self.blind: str | None = None  # why the inside of the loader is not seen, if it is not

    def unwrap(self, iterator: Iterator[Any]) -> Iterator[Any]:
        return _Unwrapping(iterator, self.records)

    def completed(self) -> list[BatchTiming]:
        """The batches received since the last call, oldest first (built here, at log points, not per batch)."""
        done = [  # the fields in BatchTiming's order (dataclasses.replace would cost ~4x as much per batch)
            BatchTiming(
                t.worker,
                t.samples,
                t.fetch_s,
                t.collate_s,
                t.busy_s,
                t.alive_s,
                t.produced_at,
                t.work_cpu_s,
                pin_s,
                requested,
                received,
                index,
                t.pid,
            )
            for t, pin_s, requested, received, index in self.records
        ]
        self.records.clear()
        return done


class _Unwrapping(Iterator):
    """The loader's iterator, handing the batch on without its timing (which goes to the probe)."""

    def __init__(self, iterator: Iterator[Any], records: deque[_Received]) -> None:
        self._iterator, self._append, self._index = iterator, records.append, 0

    def __next__(self) -> Any:
        requested = _now()
        item = next(self._iterator)
        if type(item) is TimedBatch:
            self._append((item.timing, item.pin_s, requested, _now(), self._index))
            self._index += 1
            return item.batch
        self._index += 1
        return item

    def __getattr__(self, name: str) -> Any:  # public attributes of the wrapped iterator
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._iterator, name)


def untimed(dataset: Any) -> Any:
    """The user's dataset behind the probe's wrapper (to read a sample without counting it as a fetch)."""
    return dataset.dataset if isinstance(dataset, TimedDataset) else dataset


def uninstrument(loader: Any) -> None:
    """Undo what a rebuilt copy inherited: Lightning re-creates loaders from their public attributes, so a
    copy of an instrumented loader (e.g. for ``predict``) carries the timed dataset and collate but not
    the unwrapping iterator. Left so, it would yield :class:`TimedBatch` objects."""
    from lightning_dataperf._lightning_hooks import replace_loader_dataset

    if isinstance(loader, DataLoader) and "_dataperf_probe" not in vars(loader):
        if isinstance(loader.collate_fn, TimedCollate):
            loader.collate_fn = loader.collate_fn.collate_fn
        if isinstance(loader.dataset, TimedDataset):
            replace_loader_dataset(loader, loader.dataset.dataset)


def instrument(loader: Any) -> LoaderProbe:
    """Make ``loader`` report into a probe and return it; ``probe.blind`` says why it cannot, if it cannot.

    A loader that cannot be seen into is left as it was. Instrumenting the same loader again returns
    its probe (the Trainer may process one loader more than once); a loader Lightning rebuilt from an
    instrumented one (its dataset and collate copied) is instrumented afresh, not twice.

    Example::

        probe = instrument(loader)                  # probe.blind: None, or why the inside cannot be seen
        for batch in loader:
            ...
        stats = LoaderStats.of(probe.completed())       # Workers/fetch_s, Workers/busy_fraction, ...
    """
    from lightning_dataperf._lightning_hooks import persistent_iterator_started, replace_loader_dataset
    from lightning_dataperf.loader.wrapping import add_iterator_wrapper

    # The Trainer may process one loader more than once: one probe per loader.
    existing = vars(loader).get("_dataperf_probe") if hasattr(loader, "__dict__") else None
    if isinstance(existing, LoaderProbe):
        return existing
    probe = LoaderProbe()
    if not isinstance(loader, DataLoader):
        probe.blind = f"the loader is a {type(loader).__name__}, not a torch DataLoader"
    elif isinstance(loader.dataset, IterableDataset):
        probe.blind = "the dataset is an IterableDataset (it fetches inside its own iterator)"
    # Its workers already hold the untimed dataset: a swap now would never reach them.
    elif persistent_iterator_started(loader):
        probe.blind = "its persistent workers started before DataPerfCallback could look inside"
    else:
        # A loader Lightning rebuilt from an instrumented one already holds our dataset and collate: not twice.
        replace_loader_dataset(loader, TimedDataset(untimed(loader.dataset)))
        collate = loader.collate_fn
        loader.collate_fn = TimedCollate(collate.collate_fn if isinstance(collate, TimedCollate) else collate)
        # Innermost, so that outer wrappers (the look-ahead copy) see the batch, not a TimedBatch.
        add_iterator_wrapper(loader, probe.unwrap, inner=True)
        loader._dataperf_probe = probe  # type: ignore[attr-defined]
    return probe
