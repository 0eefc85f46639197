"""A daemon thread that calls one function every ``interval`` seconds until stopped (telemetry, watchdog)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Ticker"]

log = logging.getLogger(__name__)


class Ticker:
    """Calls ``tick()`` every ``interval`` seconds on its own daemon thread; an exception is logged, not raised.

    Example::

        ticker = Ticker("lightning_dataperf-sampler", 1.0, read_sources)
        ticker.start()
        ...
        ticker.stop()            # joins the thread; safe to call twice
    """

    def __init__(self, name: str, interval: float, tick: Callable[[], None]) -> None:
        if interval <= 0:
            raise ValueError(f"Ticker(interval={interval}) must be > 0 seconds.")
        self.name, self.interval, self.tick = name, interval, tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (no-op if running)."""
        if self.running:
            return
        # A stopped ticker may be started again.
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread. Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            # Bounded, so a tick stuck in a hung read cannot hang teardown.
            self._thread.join(timeout=max(5.0, 2 * self.interval))
            self._thread = None

    def _run(self) -> None:
        # wait(), not sleep(), so that stop() wakes the thread at once.
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            # One failed tick must neither end the thread nor reach training.
            except Exception:
                log.exception("%s: tick failed", self.name)
