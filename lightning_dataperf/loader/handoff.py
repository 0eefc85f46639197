"""Worker processes start in the thread that takes the batches, also when another thread reads ahead for it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["Handoff", "ReadAhead", "start_workers"]

T = TypeVar("T")
_POLL_S = 0.05
_local = threading.local()


class Handoff:
    """Calls a reading-ahead thread asks of the consumer thread (the one that made this), run when it serves them.

    Forking worker processes from a thread while another thread runs the training step can leave the children
    holding locks nobody releases (Python warns of it from 3.12): the online loop's switch, made inside ``next()``
    of a source that a decode thread reads, hands its new iterator's start to the consumer instead.
    """

    def __init__(self, stop: threading.Event) -> None:
        self._stop, self._calls = stop, queue.SimpleQueue()
        self._consumer = threading.get_ident()

    def call(self, make: Callable[[], T]) -> T:
        """``make()`` in the consumer thread, its result or error here (at once where this is that thread)."""
        if threading.get_ident() == self._consumer:
            return make()
        done, box = threading.Event(), {}
        self._calls.put((make, done, box))
        while not done.wait(_POLL_S):
            if self._stop.is_set():
                raise RuntimeError("the loader closed before its consumer thread started the new workers")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def serve(self) -> None:
        """Run the calls waiting (in the consumer thread: at each batch it takes, and while it waits for one)."""
        while True:
            try:
                make, done, box = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                box["value"] = make()
            except BaseException as error:
                box["error"] = error
            finally:
                done.set()


class ReadAhead(Iterator[Any]):
    """``inner``, read by another thread: a ``start_workers`` inside its ``next()`` goes through ``handoff``."""

    def __init__(self, inner: Iterator[Any], handoff: Handoff) -> None:
        self.inner, self.handoff = inner, handoff

    def __next__(self) -> Any:
        _local.handoff = self.handoff
        try:
            return next(self.inner)
        finally:
            _local.handoff = None


def start_workers(make: Callable[[], T]) -> T:
    """``make()`` (which starts worker processes), in the consumer thread where a :class:`ReadAhead` reads."""
    handoff: Handoff | None = getattr(_local, "handoff", None)
    return make() if handoff is None else handoff.call(make)
