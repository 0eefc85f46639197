"""The loader of decoded batches: :class:`GpuDecodeLoader` (import it from ``lightning_dataperf.decode``)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from lightning_dataperf._lightning_hooks import shutdown_loader_iterator
from lightning_dataperf.decode._graph import release_collected
from lightning_dataperf.decode._pipeline import END, POLL_S, Failed, decode_batches, decode_one
from lightning_dataperf.decode.backend import DecodeBackend
from lightning_dataperf.decode.decoder import IMAGENET_MEAN, IMAGENET_STD, DecodeStats, JpegDecoder
from lightning_dataperf.decode.encoded import collate_encoded
from lightning_dataperf.decode.split import CpuDecoder, SplitCollate, check_share
from lightning_dataperf.loader.probe import TimedCollate

__all__ = ["GpuDecodeLoader"]

_FORK_GUARD: list[bool] = []
# epochs whose decode thread runs: stopped before the interpreter exits, not left inside a CUDA call (abort)
_RUNNING: weakref.WeakSet[_DecodeIterator] = weakref.WeakSet()


@atexit.register
def _stop_running() -> None:
    for epoch in list(_RUNNING):
        with contextlib.suppress(Exception):
            epoch.close()


def guard_forked_workers() -> None:
    """In every process forked from this one from now on, freeze what it inherits (``gc.freeze``).

    A worker's garbage collection then never runs the destructors of this process's CUDA / nvImageCodec
    objects, which crash in a child (docs/gpu_decode.md); what the child allocates is collected as usual.
    Registered once.
    """
    if not _FORK_GUARD and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=gc.freeze)
        _FORK_GUARD.append(True)


class _EpochRelay:
    """What ``loader.sampler`` returns: ``set_epoch`` reaches the real sampler and the dataset."""

    def __init__(self, owner: GpuDecodeLoader) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        owner = self.__dict__.get("_owner")
        if owner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(getattr(owner.loader, "sampler", None), name)


class GpuDecodeLoader:
    """Wrap a loader of :class:`~lightning_dataperf.decode.encoded.EncodedBatch`; yield decoded ``(images, labels)``.

    The epoch's first batch is decoded in the calling thread (where the augment's CUDA graphs are captured,
    and compiled with ``compile_augment``: in turn with a ``torch.compile`` of the model in that thread, never
    beside it); then a background thread takes the next encoded batches from ``loader`` and decodes and
    augments up to ``lookahead`` of them ahead of the step, on its own CUDA stream; each batch is handed to
    the consumer's current stream with a CUDA event (the host never waits for the GPU). On CPU the thread
    decodes with PIL.

    Args:
        loader: a ``DataLoader`` (``collate_fn=collate_encoded``) or any iterable of ``EncodedBatch``.
        device: where to decode; default ``cuda`` when available, else ``cpu``.
        lookahead: decoded batches held ready at most (device memory: ``lookahead`` output batches).
        size, dtype, channels_last, mean, std, on_error, backend, decode_threads, graph_augment, compile_augment: see
            :class:`JpegDecoder`.
        prepare_ahead: batches a prepare thread takes from ``loader`` and prepares on the host ahead
            (:meth:`JpegDecoder.prepare`: the worker hand-over, the per-sample table, the byte views, CPU
            fallbacks), and, with torchvision's decode, batches a call thread decodes ahead
            (:meth:`JpegDecoder.submit`), at most; ``0``: the decode thread does all of it, one batch at a time.
        gpu_share, cpu_decoder: split decode (:class:`JpegDecoder`): where ``loader`` is a ``DataLoader`` with
            ``collate_fn=collate_encoded``, its workers decode ``1 - gpu_share`` of each batch on the CPU
            (:class:`~lightning_dataperf.decode.split.SplitCollate`); :meth:`set_gpu_share` changes it.

    Worker processes: the decoder lives in this process only; forked workers freeze what they inherit
    (:func:`guard_forked_workers`); ``spawn``/``forkserver`` contexts work too (slower start-up).

    Lightning: return it from ``train_dataloader``. ``sampler.set_epoch`` (Lightning calls it each
    epoch) reaches the wrapped sampler and the dataset's ``set_epoch``, so crops follow the epoch.
    Lightning does not inject a distributed sampler into it: pass one to the wrapped ``DataLoader``.

    Example::

        loader = DataLoader(EncodedImageDataset.from_folder("/data/train", seed=42), batch_size=128,
                            num_workers=4, collate_fn=collate_encoded, persistent_workers=True)
        train = GpuDecodeLoader(loader, device="cuda", size=224, dtype=torch.bfloat16)
        for images, labels in train:       # images: [128, 3, 224, 224] bf16 channels_last on cuda
            ...
        print(train.stats().to_metrics())  # {"Decode/images_per_sec": ..., "Decode/cpu_fallback": ...}
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
        backend: str | DecodeBackend = "auto",
        decode_threads: int | None = None,
        graph_augment: bool = True,
        compile_augment: bool = True,
        prepare_ahead: int = 2,
        gpu_share: float = 1.0,
        cpu_decoder: str | CpuDecoder = "auto",
    ) -> None:
        if lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, not {lookahead}")
        if prepare_ahead < 0:
            raise ValueError(f"prepare_ahead must be at least 0, not {prepare_ahead}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.loader = loader
        self.lookahead = lookahead
        self.prepare_ahead = prepare_ahead
        self.decoder = JpegDecoder(
            device,
            size,
            dtype,
            channels_last,
            mean,
            std,
            on_error,
            backend=backend,
            decode_threads=decode_threads,
            graph_augment=graph_augment,
            compile_augment=compile_augment,
            gpu_share=gpu_share,
            cpu_decoder=cpu_decoder,
        )
        #: Where the share is decoded: ``"workers"`` (the wrapped DataLoader's collate) or ``"host"`` (the
        #: prepare thread: a loader whose collate this loader cannot reach).
        self.split_in = "host"
        self.set_gpu_share(gpu_share)
        self.device = self.decoder.device
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._active: _DecodeIterator | None = None
        if callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None)):
            # instance attributes: Lightning finds a stateful loader's methods statically, not via __getattr__
            self.state_dict = loader.state_dict
            self.load_state_dict = loader.load_state_dict

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._active is not None:
            self._active.close()
        # between steps, in the training thread: no capture of a compiled step's graphs is running
        release_collected()
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

    @property
    def gpu_share(self) -> float:
        """The share of each batch's images the GPU path decodes (split decode; see :meth:`set_gpu_share`)."""
        return self.decoder.gpu_share

    def set_gpu_share(self, share: float) -> None:
        """Decode ``share`` of each batch on the GPU path and the rest on the CPU, in the workers.

        The wrapped DataLoader's ``collate_encoded`` becomes a :class:`~lightning_dataperf.decode.split.SplitCollate`
        of this share: workers started from now on (the next iterator; persistent workers keep theirs until they
        restart) split their batches. Batches split otherwise, or not at all, still come out right: the decoder
        takes what each batch carries, and splits a batch no worker split in its prepare thread.

        Raises:
            ValueError: ``share`` is not a number in [0, 1].

        Example::

            loader.set_gpu_share(0.5)   # half of each batch decoded by the CPU workers, from the next epoch
        """
        share = check_share(share)
        self.decoder.gpu_share = share
        self.split_in = "workers" if self._install_collate(share) else "host"

    def _install_collate(self, share: float) -> bool:
        """Put a :class:`SplitCollate` of ``share`` in the wrapped DataLoader (inside a probe's timed collate too)
        where it collates with ``collate_encoded``; ``False`` where there is none to replace."""
        collate = getattr(self.loader, "collate_fn", None)
        timed = collate if isinstance(collate, TimedCollate) else None
        inner = timed.collate_fn if timed is not None else collate
        if inner is not collate_encoded and not isinstance(inner, SplitCollate):
            return False
        decoder = self.decoder
        # a new one each time: collate_encoded is shared by every loader
        split = SplitCollate(share, decoder.size, decoder.cpu_decoder) if share < 1 else collate_encoded
        if split == inner:
            return True
        if timed is not None:
            timed.collate_fn = split
        else:
            self.loader.collate_fn = split  # type: ignore[attr-defined]
        return True

    def stats(self) -> DecodeStats:
        """Decode telemetry so far (see :class:`DecodeStats`)."""
        return self.decoder.stats()

    def close(self) -> None:
        """Stop the decode thread of the running epoch, if any (also done at the epoch's end), and destroy the
        CUDA graphs of decoders collected since (not in a garbage collection: ``_graph.release_collected``)."""
        self._stop_epoch()
        release_collected()

    def _stop_epoch(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None

    def __del__(self) -> None:
        # may run at interpreter shutdown, or in a garbage collection inside a compiled step's capture
        with contextlib.suppress(Exception):
            self._stop_epoch()


class _DecodeIterator(Iterator):
    """One epoch. Holds the loader's parts, not the loader (no reference cycle: a dropped loader is
    freed at once, not by the cyclic garbage collector). Starts at the first ``next()``: an ``iter()``
    that is never advanced (Lightning calls one to check that a loader is iterable) decodes nothing and
    starts no worker."""

    def __init__(self, owner: GpuDecodeLoader) -> None:
        self._decoder, self._stream, self._device = owner.decoder, owner._stream, owner.device
        self._loader = owner.loader
        self._prepare_ahead = owner.prepare_ahead
        self._persistent = bool(getattr(owner.loader, "persistent_workers", False))
        self._queue: queue.Queue = queue.Queue(maxsize=owner.lookahead)
        self._stop = threading.Event()
        self._done = False
        self._source: Iterator[Any] | None = None
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        if getattr(self._loader, "num_workers", 0):
            guard_forked_workers()
        # in the calling thread, where worker processes start
        self._source = iter(self._loader)
        self._loader = None
        if not self._first():
            return
        # the thread gets the parts, not this iterator: a dropped iterator is freed (and closed) at once
        args = (self._source, self._decoder, self._stream, self._device, self._queue, self._stop, self._prepare_ahead)
        self._thread = threading.Thread(target=decode_batches, args=args, name="dataperf-gpu-decode", daemon=True)
        self._thread.start()
        _RUNNING.add(self)

    def _first(self) -> bool:
        """Decode the first batch here, in the calling thread: its one-time work (the augment's graphs, their
        ``torch.compile``) then never overlaps a ``torch.compile`` of the model in this thread (not thread-safe).
        ``False`` where the epoch ends or fails with it (no thread is started)."""
        assert self._source is not None
        try:
            item: Any = decode_one(self._decoder, self._stream, self._device, next(self._source))
        except StopIteration:
            item = END
        except BaseException as error:
            # raised by the first next(), in order
            item = Failed(error)
        self._queue.put(item)
        return item is not END and not isinstance(item, Failed)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._done:
            raise StopIteration
        if self._source is None:
            self._start()
        telemetry = self._decoder.telemetry
        depth = self._queue.qsize()
        waited = time.perf_counter()
        try:
            item = self._take()
        except BaseException:
            # e.g. a worker's death, raised here by the DataLoader's SIGCHLD handler
            self.close()
            raise
        # not a batch taken, so not counted
        if item is END or isinstance(item, Failed):
            self.close()
            if isinstance(item, Failed):
                raise item.error
            raise StopIteration
        with telemetry.lock:
            telemetry.wait_s += time.perf_counter() - waited
            telemetry.depth_sum += depth
            telemetry.depth_n += 1
        images, labels, event = item
        if event is not None:
            current = torch.cuda.current_stream(self._device)
            # a wait on the GPU, so the host goes on
            current.wait_event(event)
            # made on the decode thread's stream, used on this one
            images.record_stream(current)
            labels.record_stream(current)
        return images, labels

    def _take(self) -> Any:
        while True:
            try:
                return self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive() and self._queue.empty():
                    return Failed(RuntimeError("the GPU decode thread exited without a result"))

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
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        # what a put blocked in the drain above got in before the stop
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        if not self._persistent:
            shutdown_loader_iterator(self._source)
        self._source = iter(())

    def __del__(self) -> None:
        # may run at interpreter shutdown
        with contextlib.suppress(Exception):
            self.close()
