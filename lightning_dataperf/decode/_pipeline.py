"""The threads behind :class:`~lightning_dataperf.decode.loader.GpuDecodeLoader`: prepare, call, decode."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from lightning_dataperf.decode.decoder import JpegDecoder

__all__ = ["END", "POLL_S", "Failed", "decode_batches", "decode_one"]

#: What a stage puts after its last item.
END = object()
POLL_S = 0.1


class Failed:
    """An error raised in a stage, handed on in order."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put ``item`` into ``out`` unless ``stop`` is set first (``False`` then)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _take(source: queue.Queue, *stops: threading.Event) -> Any:
    """The next item of ``source``, or ``END`` once one of ``stops`` is set."""
    while not any(stop.is_set() for stop in stops):
        try:
            return source.get(timeout=POLL_S)
        except queue.Empty:
            continue
    return END


def _items(source: queue.Queue, *stops: threading.Event) -> Iterator[Any]:
    """What an earlier stage put into ``source``, until its ``END`` (or a stop); its error is raised here, in order."""
    while True:
        item = _take(source, *stops)
        if item is END:
            return
        if isinstance(item, Failed):
            raise item.error
        yield item


def _stage(
    source: Iterable[Any], work: Callable[[Any], Any], device: torch.device, out: queue.Queue, stop: threading.Event
) -> None:
    """A pipeline thread: ``work(item)`` for each item of ``source`` into ``out``, then ``END`` or the error."""
    try:
        if device.type == "cuda":
            # for the pinned tables and nvJPEG's outputs
            torch.cuda.set_device(device)
        for item in source:
            if stop.is_set() or not _put(out, work(item), stop):
                return
    except BaseException as error:
        # handed on, in order
        _put(out, Failed(error), stop)
    else:
        _put(out, END, stop)


def decode_batches(
    source: Iterator[Any],
    decoder: JpegDecoder,
    stream: torch.cuda.Stream | None,
    device: torch.device,
    out: queue.Queue,
    stop: threading.Event,
    prepare_ahead: int = 0,
) -> None:
    """The decode thread: decode each batch of ``source`` into ``out`` (with its CUDA event) until ``stop``.

    With ``prepare_ahead``, a prepare thread (started and joined here) takes the batches from ``source`` and
    prepares them on the host (:meth:`JpegDecoder.prepare`), and where the backend's decode call can run apart
    (:attr:`JpegDecoder.can_submit`: torchvision), a call thread makes it (:meth:`JpegDecoder.submit`, the
    GIL released); this thread then only copies the decoded images into the flat buffer and augments them.
    ``prepare_ahead`` bounds the batches waiting between two threads."""
    # the helper threads' stop: this thread's end, whatever ends it
    halt = threading.Event()
    helpers: list[tuple[threading.Thread, queue.Queue]] = []

    def start(name: str, items: Iterable[Any], work: Callable[[Any], Any]) -> Iterator[Any]:
        handed: queue.Queue = queue.Queue(maxsize=prepare_ahead)
        thread = threading.Thread(
            target=_stage, args=(items, work, device, handed, halt), name=f"dataperf-gpu-{name}", daemon=True
        )
        thread.start()
        helpers.append((thread, handed))
        return _items(handed, stop, halt)

    def loop() -> None:
        batches: Iterable[Any] = (decoder.prepare(batch) for batch in source)
        if prepare_ahead:
            batches = start("prepare", source, decoder.prepare)
            if decoder.can_submit:
                batches = start("call", batches, decoder.submit)
        for item in batches:
            if stop.is_set():
                return
            images, labels = decoder.run(item)
            if not _put(out, (images, labels, _ready(stream)), stop):
                return

    try:
        if stream is not None:
            torch.cuda.set_device(device)
            with torch.cuda.stream(stream):
                loop()
        else:
            loop()
    except BaseException as error:
        # handed to the consumer
        _put(out, Failed(error), stop)
    else:
        _put(out, END, stop)
    finally:
        halt.set()
        for _thread, handed in helpers:
            # a put blocked on a full queue sees the halt anyway
            with contextlib.suppress(queue.Empty):
                while True:
                    handed.get_nowait()
        for thread, _ in helpers:
            thread.join(timeout=30)


def _ready(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    """An event on ``stream`` after the work queued so far (the consumer's stream waits for it); none on CPU."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def decode_one(
    decoder: JpegDecoder, stream: torch.cuda.Stream | None, device: torch.device, batch: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event | None]:
    """One batch, prepared, decoded and augmented in the calling thread, on ``stream``."""
    if stream is None:
        return (*decoder(batch), None)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        images, labels = decoder(batch)
        return images, labels, _ready(stream)
