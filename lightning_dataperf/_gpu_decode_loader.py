"""The background decode thread behind :class:`GpuDecodeLoader` (import it from ``lightning_dataperf.gpu_decode``)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from lightning_dataperf.gpu_decode import IMAGENET_MEAN, IMAGENET_STD, DecodeStats, JpegDecoder

__all__ = ["GpuDecodeLoader"]

_END = object()
_POLL_S = 0.1


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _EpochRelay:
    """What ``loader.sampler`` returns: ``set_epoch`` reaches the real sampler and the dataset."""

    def __init__(self, owner: GpuDecodeLoader) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(self._owner.loader, "sampler", None), name)


class GpuDecodeLoader:
    """Wrap a loader of :class:`~lightning_dataperf.jpeg_batches.EncodedBatch`; yield decoded ``(images, labels)``.

    A background thread takes the next encoded batches from ``loader`` and decodes and augments up to
    ``lookahead`` of them ahead of the step, on its own CUDA stream; each batch is handed to the
    consumer's current stream with a CUDA event (the host never waits for the GPU). On CPU the thread
    decodes with PIL.

    Args:
        loader: a ``DataLoader`` (``collate_fn=collate_encoded``) or any iterable of ``EncodedBatch``.
        device: where to decode; default ``cuda`` when available, else ``cpu``.
        lookahead: decoded batches held ready at most (device memory: ``lookahead`` output batches).
        size, dtype, channels_last, mean, std, on_error, backend, decode_threads: see :class:`JpegDecoder`
            (``backend="auto"``: nvImageCodec when installed, else torchvision's nvJPEG).

    Lightning: return it from ``train_dataloader``. ``sampler.set_epoch`` (Lightning calls it each
    epoch) reaches the wrapped sampler and the dataset's ``set_epoch``, so crops follow the epoch.
    Lightning does not inject a distributed sampler into it: pass one to the wrapped ``DataLoader``.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: str | torch.device | None = None,
        lookahead: int = 3,
        size: int = 224,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = True,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        on_error: str = "raise",
        backend: str = "auto",
        decode_threads: int | None = None,
    ) -> None:
        if lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, not {lookahead}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.loader = loader
        self.lookahead = lookahead
        self.decoder = JpegDecoder(
            device, size, dtype, channels_last, mean, std, on_error, backend=backend, decode_threads=decode_threads
        )
        self.device = self.decoder.device
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._active: _DecodeIterator | None = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._active is not None:
            self._active.close()
        self._active = _DecodeIterator(self)
        return self._active

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    @property
    def sampler(self) -> _EpochRelay:
        return _EpochRelay(self)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the wrapped sampler (if it has ``set_epoch``) and of the dataset's augmentations."""
        for owner in (getattr(self.loader, "sampler", None), self.dataset):
            set_epoch = getattr(owner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def stats(self) -> DecodeStats:
        """Decode telemetry so far (see :class:`DecodeStats`)."""
        return self.decoder.stats()

    def close(self) -> None:
        """Stop the decode thread of the running epoch, if any (also done at the epoch's end)."""
        if self._active is not None:
            self._active.close()
            self._active = None


class _DecodeIterator(Iterator):
    def __init__(self, owner: GpuDecodeLoader) -> None:
        self._owner = owner
        self._source = iter(owner.loader)  # in the calling thread: worker processes start here
        self._queue: queue.Queue = queue.Queue(maxsize=owner.lookahead)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="dataperf-gpu-decode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        owner = self._owner
        try:
            if owner._stream is not None:
                torch.cuda.set_device(owner.device)
                with torch.cuda.stream(owner._stream):
                    self._loop()
            else:
                self._loop()
        except BaseException as error:  # handed to the consumer
            self._put(_Failed(error))
        else:
            self._put(_END)

    def _loop(self) -> None:
        stream = self._owner._stream
        for batch in self._source:
            if self._stop.is_set():
                return
            images, labels = self._owner.decoder(batch)
            event = None
            if stream is not None:
                event = torch.cuda.Event()
                event.record(stream)
            if not self._put((images, labels, event)):
                return

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._done:
            raise StopIteration
        telemetry = self._owner.decoder.telemetry
        depth = self._queue.qsize()
        waited = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    item = _Failed(RuntimeError("the GPU decode thread exited without a result"))
                    break
        with telemetry.lock:
            telemetry.wait_s += time.perf_counter() - waited
            telemetry.depth_sum += depth
            telemetry.depth_n += 1
        if item is _END or isinstance(item, _Failed):
            self.close()
            if isinstance(item, _Failed):
                raise item.error
            raise StopIteration
        images, labels, event = item
        if event is not None:
            current = torch.cuda.current_stream(self._owner.device)
            current.wait_event(event)  # on the GPU; the host goes on
            images.record_stream(current)  # made on the decode thread's stream, used on this one
            labels.record_stream(current)
        return images, labels

    def close(self) -> None:
        """Stop the thread, drop decoded batches not taken, release the source iterator (and its workers)."""
        if self._done:
            return
        self._done = True
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        shutdown = getattr(self._source, "_shutdown_workers", None)
        if callable(shutdown) and not getattr(self._owner.loader, "persistent_workers", False):
            shutdown()
        self._source = iter(())

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()
