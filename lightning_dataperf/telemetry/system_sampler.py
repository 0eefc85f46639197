"""Background system telemetry: one thread reads every source each interval and keeps interval means."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable

from lightning_dataperf.telemetry.sources import CpuSource, DiskSource, GpuSource, MemorySource, ProcessSource, Source
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.telemetry.ticker import Ticker

__all__ = ["SystemSampler", "default_sources"]


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
    epoch shorter than the interval has figures.

    Args:
        interval: seconds between readings.
        cuda_device: this rank's CUDA device index, or ``None`` for no GPU telemetry.
        data_path: dataset location, to pick the disk to watch.
        sources: source factories (default: :func:`default_sources`); tests pass fakes.

    Example::

        sampler = SystemSampler(interval=0.5, cuda_device=0)
        sampler.start()
        ...
        print(sampler.epoch_means().gpu_util_percent)
        sampler.stop()
    """

    def __init__(
        self,
        interval: float = 1.0,
        cuda_device: int | None = None,
        data_path: str | os.PathLike[str] | None = None,
        sources: Iterable[SourceFactory] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"SystemSampler(interval={interval}) must be > 0 seconds.")
        self.interval = interval
        self.unavailable: dict[str, str] = {}
        self._factories = list(sources) if sources is not None else default_sources(cuda_device, data_path)
        self._sources: list[Source] = []
        self._read_lock = threading.Lock()  # one reader of the sources at a time (their deltas are stateful)
        self._lock = threading.Lock()  # the accumulators: held only for microseconds, never during a read
        self._ticker = Ticker("lightning_dataperf-sampler", interval, self._tick)
        self._window = _Means()
        self._epoch = _Means()
        self._last_read = time.monotonic()

    @property
    def running(self) -> bool:
        return self._ticker.running

    def start(self) -> None:
        """Open the sources and start the thread (no-op if already running)."""
        if self.running:
            return
        self._sources = [source for factory in self._factories if (source := self._open(factory)) is not None]
        # The first interval must not include the wait between construction and start.
        self._last_read = time.monotonic()
        self._ticker.start()

    def stop(self) -> None:
        """Stop and join the thread and close the sources. Safe to call twice."""
        self._ticker.stop()
        with self._read_lock:
            # Wait out a read in progress (epoch_means on the training thread) before closing the sources.
            for source in self._sources:
                source.close()
            self._sources = []

    def window_means(self) -> SystemStats:
        """Means of the readings since the last call (no reading of its own: cheap at every log point)."""
        with self._lock:
            # Swapped under the lock, so that each reading lands in exactly one window.
            means, self._window = self._window.means(), _Means()
        return SystemStats.from_mapping(means)

    def epoch_means(self) -> SystemStats:
        """Means since :meth:`reset_epoch`, with one fresh reading first unless the last one is recent."""
        # The read lock before the data lock, the order _sample keeps too, so that the two never deadlock.
        with self._read_lock:
            with self._lock:
                stale = not self._epoch.counts or time.monotonic() - self._last_read >= 0.25 * self.interval
            if stale and self._sources:
                self._sample()
        with self._lock:
            return SystemStats.from_mapping(self._epoch.means())

    def reset_epoch(self) -> None:
        with self._lock:
            self._epoch = _Means()

    def _open(self, factory: SourceFactory) -> Source | None:
        try:
            # Telemetry never stops training: a source that fails is dropped with one warning.
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

    def _tick(self) -> None:
        with self._read_lock:
            self._sample()

    def _sample(self) -> None:
        """Read every source (caller holds the read lock), then add the values under the data lock."""
        now = time.monotonic()
        elapsed, self._last_read = now - self._last_read, now
        values: dict[str, float] = {}
        # A copy: a failing source is removed inside the loop.
        for source in list(self._sources):
            try:
                # A source that fails mid-run is dropped the same way.
                values.update(source.read(elapsed))
            except Exception as error:
                self._sources.remove(source)
                source.close()
                self._disable(source.name, error)
        with self._lock:
            self._window.add(values)
            self._epoch.add(values)
