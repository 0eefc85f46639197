"""A prototype, measured and NOT adopted: GPU decode in a process of its own (issue 17, session 8).

Measured on an H200 (benchmarks/README.md, "GPU JPEG decode", session 8): slower than the decode thread
(ResNet-18 52.7-58.3% of the compute-only ceiling against 57.2-61.7%; ResNet-50 72.1-72.8% against
76.5-92.0%): without MPS the GPU time-slices between the two processes' CUDA contexts, and the child's
short kernels wait for their slices (its decode of a batch took 23-43 ms next to training, ~10 ms alone).
Kept so the measurement can be repeated: ``benchmarks/gpu_decode_probe.py --paths torchvision:graph:process``.

Why it was tried: in the training process a decode thread shares the GIL with the training step. Here
the decoder runs in a spawned child with its own interpreter and CUDA context; the training process keeps
the ``DataLoader`` (sampler, epoch, resume state, workers) and per batch only forwards the encoded batch
and takes a slot back:

- the child decodes and augments (``JpegDecoder``) into one of ``lookahead`` fixed output slots (device
  tensors shared once over CUDA IPC, never per batch) and records that slot's inter-process "ready" event;
- the parent makes its current stream wait for that event (on the GPU, no host wait), clones the slot on
  that stream and records the slot's "free" event, which the child's stream waits for before it writes
  there again. No ``synchronize`` per step on either side.

Example::

    train = ProcessDecodeLoader(loader, device="cuda", dtype=torch.bfloat16)
    for images, labels in train:
        ...
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import sys
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from lightning_dataperf.decode.stats import DecodeStats

__all__ = ["DecodeProcess", "ProcessDecodeLoader", "ProcessIterator", "hidden_main"]

_POLL_S = 0.1
_START_TIMEOUT_S = 300.0
_COUNTERS = ("batches", "images", "cpu_fallback", "undecodable", "decode_s", "submit_s", "submit_cpu_s")


@contextlib.contextmanager
def hidden_main() -> Iterator[None]:
    """While starting a ``spawn`` child, hide ``__main__``'s file and spec from ``multiprocessing``.

    The child's target lives in this package, so the child has no need of the user's script; a
    training script without an ``if __name__ == "__main__":`` guard would otherwise run again in
    the child (multiprocessing's ``spawn.get_preparation_data`` reads these two attributes).
    """
    main = sys.modules.get("__main__")
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if main and name in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.dumps(error)
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _child(options: dict[str, Any], index: int, slots: int, inbox: Any, outbox: Any) -> None:
    """The decode process: decode each encoded batch from ``inbox`` into a free slot, report on ``outbox``."""
    from lightning_dataperf.decode.decoder import JpegDecoder

    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    try:
        decoder = JpegDecoder(device, **options)
    except BaseException as error:
        outbox.put(("error", -1, _picklable(error), ()))
        return
    outbox.put(("hello", decoder.backend.name if decoder.backend is not None else "pil"))
    stream = torch.cuda.Stream(device)
    free_events: list[torch.cuda.Event] = []
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
    ready: list[torch.cuda.Event] = []
    free: deque[int] = deque()
    telemetry = decoder.telemetry

    def counters() -> tuple[float, ...]:
        with telemetry.lock:
            telemetry.drain()
            return tuple(float(getattr(telemetry, name)) for name in _COUNTERS)

    with torch.cuda.stream(stream):
        while True:
            kind, payload = inbox.get()
            if kind == "stop":
                break
            if kind == "events":
                free_events = [torch.cuda.Event.from_ipc_handle(device, handle) for handle in payload]
                continue
            if kind == "free":
                free.append(payload)
                continue
            sequence, batch = payload
            try:
                images, labels = decoder(batch)
            except BaseException as error:  # raised in the parent at this batch's place
                outbox.put(("error", sequence, _picklable(error), counters()))
                continue
            if not outputs and len(images):
                outputs = [(torch.empty_like(images), torch.empty_like(labels)) for _ in range(slots)]
                ready = [torch.cuda.Event(interprocess=True) for _ in range(slots)]
                free.extend(range(slots))
                stream.synchronize()  # once: torch's IPC event is recorded on the sending thread's stream
                outbox.put(("slots", outputs, [event.ipc_handle() for event in ready]))
            if not outputs or len(images) > len(outputs[0][0]) or images.shape[1:] != outputs[0][0].shape[1:]:
                stream.synchronize()  # the rare batch that does not fit: sent as tensors
                outbox.put(("tensors", sequence, (images, labels), counters()))
                continue
            slot = free.popleft()
            stream.wait_event(free_events[slot])  # the parent's copy out of this slot is done
            count = len(images)
            outputs[slot][0][:count].copy_(images)
            outputs[slot][1][:count].copy_(labels)
            ready[slot].record(stream)
            outbox.put(("slot", sequence, (slot, count), counters()))
    del outputs
    torch.cuda.synchronize(device)
    torch.cuda.ipc_collect()


def cuda_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if device.index is None else device


class Waits:
    """The parent's side of the telemetry: how long the step waited, and how many results were ready."""

    def __init__(self) -> None:
        self.wait_s, self.depth_sum, self.takes = 0.0, 0, 0


class DecodeProcess:
    """The parent's handle on one decode child (started at the first :meth:`submit`, kept across epochs).

    Args:
        device: the CUDA device both processes use.
        options: :class:`~lightning_dataperf.decode.decoder.JpegDecoder` keyword arguments.
        slots: output slots (the most batches in flight).
    """

    def __init__(self, device: torch.device, options: dict[str, Any], slots: int) -> None:
        self.device, self.options, self.slots = device, dict(options), slots
        self._process: Any = None
        self._outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._ready: list[torch.cuda.Event] = []
        self._free: list[torch.cuda.Event] = []
        self._sequence = 0
        self._pending: deque[int] = deque()
        self.backend = ""
        self.counters: dict[str, float] = dict.fromkeys(_COUNTERS, 0.0)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def ready_count(self) -> int:
        """Results the child has sent and the parent not taken yet (approximate)."""
        try:
            return self._outbox.qsize() if self._process is not None else 0
        except NotImplementedError:  # macOS
            return 0

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._inbox, self._outbox = context.Queue(), context.Queue()
        self._free = [torch.cuda.Event(interprocess=True) for _ in range(self.slots)]
        self._inbox.put(("events", [event.ipc_handle() for event in self._free]))
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        process = context.Process(
            target=_child,
            args=(self.options, index, self.slots, self._inbox, self._outbox),
            name="dataperf-gpu-decode",
            daemon=True,
        )
        with hidden_main():
            process.start()
        self._process = process

    def submit(self, batch: Any) -> None:
        """Send one encoded batch to the child (results come back in submission order)."""
        if self._process is None:
            self._start()
        self._inbox.put(("batch", (self._sequence, batch)))
        self._pending.append(self._sequence)
        self._sequence += 1

    def receive(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The oldest submitted batch, decoded, on the current stream; raises the child's error for it."""
        expected = self._pending.popleft()
        while True:
            message = self._get()
            if message[0] == "slots":
                self._outputs = list(message[1])
                self._ready = [torch.cuda.Event.from_ipc_handle(self.device, handle) for handle in message[2]]
                continue
            if message[0] == "hello":
                self.backend = message[1]
                continue
            kind, sequence, body, counters = message
            if counters:
                self.counters = dict(zip(_COUNTERS, counters, strict=True))
            if kind == "error" and sequence in (expected, -1):  # -1: the decoder could not even be built
                raise body
            if sequence != expected:  # cannot happen: one child, one queue each way
                raise RuntimeError(f"GPU decode process returned batch {sequence}, expected {expected}")
            current = torch.cuda.current_stream(self.device)
            if kind == "tensors":
                images, labels = (tensor.clone(memory_format=torch.preserve_format) for tensor in body)
                current.synchronize()  # the child may reuse the memory once our reference is gone
                return images, labels
            slot, count = body
            current.wait_event(self._ready[slot])
            keep = torch.preserve_format
            images, labels = (tensor[:count].clone(memory_format=keep) for tensor in self._outputs[slot])
            self._free[slot].record(current)
            self._inbox.put(("free", slot))
            return images, labels

    def _get(self) -> Any:
        waited = time.perf_counter()
        while True:
            try:
                return self._outbox.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._process.is_alive():
                    raise RuntimeError(
                        f"the GPU decode process exited (exit code {self._process.exitcode}) without a result; "
                        "decode_in='thread' runs the decoder in this process"
                    ) from None
                if time.perf_counter() - waited > _START_TIMEOUT_S:
                    raise RuntimeError(f"the GPU decode process gave no result in {_START_TIMEOUT_S:.0f} s") from None

    def discard(self) -> None:
        """Take and drop every batch still in flight (an epoch left early)."""
        while self._pending:
            with contextlib.suppress(Exception):
                self.receive()

    def close(self) -> None:
        """Stop the child (after the GPU is done with its slots) and release everything shared with it."""
        if self._process is None:
            return
        self.discard()
        torch.cuda.synchronize(self.device)
        idle = torch.cuda.Stream(self.device)
        with torch.cuda.stream(idle):  # torch's IPC deleter synchronizes the current stream: an idle one
            self._outputs, self._ready = [], []
        self._inbox.put(("stop", None))
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5)
        for box in (self._inbox, self._outbox):
            box.close()
            box.join_thread()
        self._process = None

    def stats(self, waits: Waits) -> DecodeStats:
        """The child's counters (as of its last result) and the parent's waits, as :class:`DecodeStats`."""
        from lightning_dataperf.decode.decoder import _jpeg_utilisation

        c = self.counters
        return DecodeStats(
            batches=int(c["batches"]),
            images=int(c["images"]),
            decode_seconds=c["decode_s"],
            submit_seconds=c["submit_s"],
            wait_seconds=waits.wait_s,
            lookahead_mean=waits.depth_sum / waits.takes if waits.takes else 0.0,
            takes=waits.takes,
            cpu_fallback=int(c["cpu_fallback"]),
            undecodable=int(c["undecodable"]),
            jpeg_util_percent=_jpeg_utilisation(self.device),
            submit_cpu_seconds=c["submit_cpu_s"],
            backend=self.backend,
        )


class ProcessIterator(Iterator):
    """One epoch through a :class:`DecodeProcess`: keeps ``lookahead`` encoded batches in the child, in order."""

    def __init__(self, loader: Any, process: DecodeProcess, lookahead: int, waits: Waits) -> None:
        self._process, self._lookahead, self._waits = process, lookahead, waits
        self._persistent = bool(getattr(loader, "persistent_workers", False))
        self._source = iter(loader)
        self._exhausted = self._done = False

    def _fill(self) -> None:
        while not self._exhausted and self._process.in_flight < self._lookahead:
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                return
            self._process.submit(batch)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._done:
            raise StopIteration
        try:
            self._fill()
            if not self._process.in_flight:
                raise StopIteration
            depth, waited = self._process.ready_count(), time.perf_counter()
            batch = self._process.receive()
        except BaseException:  # the child's error for this batch, a worker's death, or the end
            self.close()
            raise
        waits = self._waits
        waits.wait_s += time.perf_counter() - waited
        waits.depth_sum += depth
        waits.takes += 1
        return batch

    def close(self) -> None:
        """Drop what is still in flight, release the source iterator (and its workers unless persistent)."""
        if self._done:
            return
        self._done = True
        self._process.discard()
        shutdown = getattr(self._source, "_shutdown_workers", None)
        if callable(shutdown) and not self._persistent:
            shutdown()
        self._source = iter(())

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()


class ProcessDecodeLoader:
    """``GpuDecodeLoader``'s interface over a :class:`DecodeProcess` (``decoder`` is ``None``: in the child)."""

    decoder = None

    def __init__(self, loader: Any, device: str | torch.device = "cuda", lookahead: int = 3, **options: Any) -> None:
        self.loader, self.lookahead, self.device = loader, lookahead, cuda_device(device)
        options.setdefault("dtype", torch.float32)
        self._process = DecodeProcess(self.device, options, lookahead)
        self._waits = Waits()
        self._active: ProcessIterator | None = None

    def __iter__(self) -> ProcessIterator:
        if self._active is not None:
            self._active.close()
        self._active = ProcessIterator(self.loader, self._process, self.lookahead, self._waits)
        return self._active

    def stats(self) -> DecodeStats:
        return self._process.stats(self._waits)

    def close(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None
        self._process.close()
