"""Side-stream host-to-device copies that overlap the previous step's compute (a step costs about max(compute, copy)).

Why it is safe across streams is in docs/transfer.md.
"""

from __future__ import annotations

import functools
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from lightning_dataperf.batches import iter_tensors, map_tensors
from lightning_dataperf.transfer.regime import CopyRegime
from lightning_dataperf.transfer.stats import CopyTiming

__all__ = ["DEFAULT_MIN_BYTES", "DEFAULT_TIMING_EVERY", "DeviceTransform", "SideStreamCopier", "check_copy_options"]

DeviceTransform = Callable[[Any], Any]
_T = TypeVar("_T")


@dataclass
class _InFlight:
    """A batch whose copy was issued. ``copy_done`` is ``None`` for a small batch left to the compute stream."""

    batch: Any
    copy_done: torch.cuda.Event | None
    bytes: int
    side_tensors: list[torch.Tensor] = field(default_factory=list)
    copy_start: torch.cuda.Event | None = None  # only on timed copies
    copy_end: torch.cuda.Event | None = None  # timed copies with a device_transform: between copy and transform


@dataclass
class _HandedOver:
    """What is left of a timed copy once handed over: its events and size, never the tensors themselves."""

    copy_start: torch.cuda.Event
    copy_end: torch.cuda.Event | None  # None: the copy ends at copy_done (no device_transform)
    copy_done: torch.cuda.Event
    bytes: int
    wait_start: torch.cuda.Event
    wait_end: torch.cuda.Event


class _EventPool:
    """Reuses CUDA events: creating one costs the host more than recording it.

    An event may be taken again once every wait on it has been enqueued (a wait binds to the record
    made before it) and, for timing events, once its elapsed time has been read.
    """

    def __init__(self) -> None:
        self._free: dict[bool, list[torch.cuda.Event]] = {False: [], True: []}

    def take(self, timing: bool) -> torch.cuda.Event:
        free = self._free[timing]
        return free.pop() if free else torch.cuda.Event(enable_timing=timing)

    def give(self, *events: torch.cuda.Event, timing: bool) -> None:
        self._free[timing].extend(events)


#: Copy records kept for read-back when nobody asks for them (bounded so that they cannot pile up).
MAX_PENDING_COPY_RECORDS = 4096

#: Batches below this many bytes are copied on the compute stream (see ``SideStreamCopier``).
DEFAULT_MIN_BYTES = 2 << 20

#: One side-stream copy in this many is timed with CUDA events (see ``SideStreamCopier``).
DEFAULT_TIMING_EVERY = 4


def check_copy_options(min_bytes: int, timing_every: int) -> None:
    if min_bytes < 0:
        raise ValueError(f"min_bytes={min_bytes} must be >= 0 (0 sends every batch through the side stream).")
    if timing_every < 1:
        raise ValueError(f"timing_every={timing_every}: one copy in N is timed, so timing_every >= 1.")


class SideStreamCopier:
    """Copies batches on one side stream of ``device`` and hands them to the compute stream.

    Args:
        device: the CUDA device.
        pin: pin unpinned host tensors in this (main) process before copying. If ``False``, such
            tensors are copied synchronously from pageable memory and a warning says so once.
        device_transform: applied to the batch on the side stream right after the copy (e.g. cast
            uint8 images to float and normalise), so it overlaps compute too.
        min_bytes: batches smaller than this (default 2 MiB) are copied the stock way,
            ``non_blocking`` on the compute stream when handed over (``device_transform`` still
            applied). Their copy takes about as much GPU time (2 MiB: ~40 us at 55 GB/s) as the
            side-stream bookkeeping takes host time (events, two ``wait_event``, allocating before
            copying; see ``benchmarks/side_stream_host_cost.py``), which a host-bound run pays every step.
            ``0`` sends every batch through the side stream.
        timing_every: time one copy in this many (default 4) with CUDA events (copy time, GB/s, hidden
            share for :meth:`completed`); the others skip the timing events and their read-back.
        allocate_on_compute: where :meth:`issue` takes device memory from by default (see there).
        stock_when_host_bound: copy large batches the stock way (pinned, ``non_blocking`` on the compute stream)
            while the GPU is found idle at the hand-overs, where the side stream hides nothing and costs host
            time (:class:`~lightning_dataperf.transfer.regime.CopyRegime`, :attr:`regime`); ``False``: always
            the side stream.

    Example::

        copier = SideStreamCopier(torch.device("cuda", 0))
        inflight = copier.issue(host_batch)           # copy starts on the side stream
        batch = copier.hand_over(inflight)            # compute stream waits on the GPU, not the host
    """

    def __init__(
        self,
        device: torch.device,
        pin: bool = True,
        device_transform: DeviceTransform | None = None,
        min_bytes: int = DEFAULT_MIN_BYTES,
        timing_every: int = DEFAULT_TIMING_EVERY,
        allocate_on_compute: bool = True,
        stock_when_host_bound: bool = True,
    ) -> None:
        check_copy_options(min_bytes, timing_every)
        self.device = device
        self._device_index = device.index  # an int is parsed faster than a torch.device on every lookup
        self.pin = pin
        self.device_transform = device_transform
        self.min_bytes = min_bytes
        self.timing_every = timing_every
        self.allocate_on_compute = allocate_on_compute
        self._stream: torch.cuda.Stream | None = None
        self._events = _EventPool()
        self._compute_mark: torch.cuda.Event | None = None  # re-recorded for every batch the side stream waits on
        self._handed_over: deque[_HandedOver] = deque(maxlen=MAX_PENDING_COPY_RECORDS)
        self._warned: set[str] = set()
        self._side_copies = 0
        self.regime: CopyRegime | None = CopyRegime() if stock_when_host_bound else None

    @property
    def stream(self) -> torch.cuda.Stream:
        """The side stream, created once on first use."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    def issue(self, batch: Any, allocate_on_compute: bool | None = None) -> _InFlight:
        """Start copying ``batch`` to the device on the side stream. Returns at once.

        ``allocate_on_compute`` (default: the copier's setting) takes the device memory from the compute
        stream's pool, where the step frees it, and has the side stream wait for the compute work queued
        so far before copying (no ``record_stream``). ``False`` allocates on the side stream and marks
        each tensor with ``record_stream`` instead; the copy may then also overlap compute work that is
        already queued (what ``lookahead=0`` relies on).
        """
        host_bytes = sum(tensor.nbytes for tensor in iter_tensors(batch) if tensor.device.type == "cpu")
        # Below min_bytes the side stream's bookkeeping costs the host about what the copy costs the GPU.
        if host_bytes < self.min_bytes:
            return _InFlight(batch, None, host_bytes)
        compute = torch.cuda.current_stream(self._device_index)
        if self.regime is not None and self.regime.observe(compute_idle=compute.query()):
            # pinned now, as the side stream would; copied on the compute stream at hand-over
            return _InFlight(map_tensors(batch, self._pinned), None, host_bytes)
        # Timing events and their read-back cost host time, so only one copy in timing_every pays it.
        timed = self._side_copies % self.timing_every == 0
        self._side_copies += 1
        start = self._events.take(timing=True) if timed else None
        copied = self._events.take(timing=True) if timed and self.device_transform is not None else None
        # An event without timing is cheaper to record and wait on.
        done = self._events.take(timing=timed)
        on_compute = self.allocate_on_compute if allocate_on_compute is None else allocate_on_compute
        stream = self.stream
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        objects: list[Any] = []  # leaves with .to() that are not tensors: moved on the side stream
        if on_compute:
            batch = map_tensors(batch, lambda value: self._allocate(value, copies, objects))
            # The new blocks may be ones that queued compute work still reads.
            stream.wait_event(self._mark(compute))
        move_the_rest = bool(objects) or not on_compute
        events = (start, copied, done)
        batch, side_tensors = self._run_on(
            stream, compute, functools.partial(self._enqueue, stream, batch, copies, move_the_rest, events)
        )
        return _InFlight(batch, done, host_bytes, side_tensors, start, copied)

    def hand_over(self, inflight: _InFlight) -> Any:
        """Make the current (compute) stream wait for the copy, on the GPU, and return the batch."""
        if inflight.copy_done is None:  # a small batch, or a host-bound run: the stock copy, on the compute stream
            batch = map_tensors(inflight.batch, self._to_device)
            return batch if self.device_transform is None else self.device_transform(batch)
        compute = torch.cuda.current_stream(self._device_index)
        if inflight.copy_start is None:
            compute.wait_event(inflight.copy_done)
            # Reusable at once: the only wait on it is already enqueued.
            self._events.give(inflight.copy_done, timing=False)
        else:
            wait_start, wait_end = self._events.take(timing=True), self._events.take(timing=True)
            # Events around the wait time how long compute was exposed to the copy.
            wait_start.record(compute)
            compute.wait_event(inflight.copy_done)
            wait_end.record(compute)
            self._handed_over.append(
                _HandedOver(
                    inflight.copy_start, inflight.copy_end, inflight.copy_done, inflight.bytes, wait_start, wait_end
                )
            )
        for tensor in inflight.side_tensors:  # the allocator must not reuse them before compute is done
            tensor.record_stream(compute)
        return inflight.batch

    def completed(self) -> list[CopyTiming]:
        """Timings of the timed copies whose compute-side wait has finished. Never blocks."""
        done = []
        # Hand-overs finish in compute-stream order, so the first unfinished one ends the scan.
        while self._handed_over and self._handed_over[0].wait_end.query():
            record = self._handed_over.popleft()
            copy_end = record.copy_end or record.copy_done
            copy = record.copy_start.elapsed_time(copy_end) / 1e3
            transform = 0.0 if record.copy_end is None else record.copy_end.elapsed_time(record.copy_done) / 1e3
            exposed = record.wait_start.elapsed_time(record.wait_end) / 1e3
            # Elapsed times read: the events may be taken again.
            self._events.give(record.copy_start, record.copy_done, record.wait_start, record.wait_end, timing=True)
            if record.copy_end is not None:
                self._events.give(record.copy_end, timing=True)
            done.append(CopyTiming(copy=copy, bytes=record.bytes, exposed=exposed, transform=transform))
        return done

    def _mark(self, compute: torch.cuda.Stream) -> torch.cuda.Event:
        """An event recorded now on the compute stream (``Stream.wait_stream`` would create a new one)."""
        if self._compute_mark is None:
            self._compute_mark = torch.cuda.Event()
        self._compute_mark.record(compute)
        return self._compute_mark

    def _run_on(self, stream: torch.cuda.Stream, compute: torch.cuda.Stream, work: Callable[[], _T]) -> _T:
        """``work()`` with ``stream`` current; a bare ``set_stream`` pair when the current device is ours.

        ``torch.cuda.stream`` saves and restores the current device and stream on every entry, which is
        most of its host cost; in training the current device is the copier's, so setting the side
        stream and then the compute stream back is enough.
        """
        if torch.cuda.current_device() != self._device_index:
            with torch.cuda.stream(stream):
                return work()
        torch.cuda.set_stream(stream)
        try:
            return work()
        finally:
            torch.cuda.set_stream(compute)

    def _enqueue(
        self,
        stream: torch.cuda.Stream,
        batch: Any,
        copies: list[tuple[torch.Tensor, torch.Tensor]],
        move_the_rest: bool,
        events: tuple[torch.cuda.Event | None, torch.cuda.Event | None, torch.cuda.Event],
    ) -> tuple[Any, list[torch.Tensor]]:
        """The side stream's work for one batch (``stream`` is current): copies, other moves, the transform.

        ``events``: (start, copied, done); start and copied only on timed copies, copied only with a
        ``device_transform``. Returns the batch and the tensors allocated on the side stream
        (``record_stream`` at hand-over).
        """
        start, copied, done = events
        side_tensors: list[torch.Tensor] = []
        if start is not None:
            start.record(stream)
        for target, source in copies:
            target.copy_(source, non_blocking=True)
        if move_the_rest:  # objects with .to(), or every tensor when memory comes from the side stream
            batch = map_tensors(batch, lambda value: self._copy(value, side_tensors))
        if copied is not None:
            copied.record(stream)
        if self.device_transform is not None:
            compute_ids = {id(target) for target, _ in copies}  # alive in `copies`: ids stay unique
            batch = self._transform(batch, stream)
            side_tensors = [t for t in iter_tensors(batch) if t.device.type == "cuda" and id(t) not in compute_ids]
        done.record(stream)
        return batch, side_tensors

    def _allocate(self, value: Any, copies: list[tuple[torch.Tensor, torch.Tensor]], objects: list[Any]) -> Any:
        """A device tensor from the current (compute) stream's pool for a host tensor; the copy comes later."""
        if type(value) is not torch.Tensor or value.requires_grad:
            # Objects with .to(), tensor subclasses (their .to() keeps type and metadata, empty_like
            # would not) and tensors that require grad: moved with .to() on the side stream.
            objects.append(value)
            return value
        if value.device.type != "cpu":
            return value
        source = self._pinned(value)
        # Allocated while the compute stream is current: from its pool, where the step frees it.
        target = torch.empty_like(source, device=self.device)
        copies.append((target, source))
        return target

    def _transform(self, batch: Any, stream: torch.cuda.Stream) -> Any:
        """``device_transform`` on the side stream; its inputs are marked as read there."""
        inputs = [tensor for tensor in iter_tensors(batch) if tensor.device.type == "cuda"]
        transformed = self.device_transform(batch)  # type: ignore[misc]
        for tensor in inputs:  # the step may free them into another stream's pool while the transform runs
            tensor.record_stream(stream)
        return transformed

    def _copy(self, value: Any, side_tensors: list[torch.Tensor]) -> Any:
        """Move a host tensor or an object with ``.to()`` on the side stream (device tensors pass through)."""
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value
        moved = self._to_device(self._pinned(value))
        side_tensors.extend(tensor for tensor in iter_tensors(moved) if tensor.device.type == "cuda")
        return moved

    def _pinned(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.is_pinned():
            return value
        # A non_blocking copy from pageable memory is staged by the driver and effectively synchronous.
        if not self.pin:
            self._warn_once(
                "pageable",
                "SideStreamCopier(pin=False) got a tensor in pageable memory: its copy is staged by the driver and "
                "is synchronous. Set DataLoader(pin_memory=True) or pin=True for overlapped copies.",
            )
            return value
        try:
            return value.pin_memory()
        except RuntimeError as error:  # host memory for pinning exhausted
            self._warn_once(
                "pin_failed",
                f"Pinning a {tuple(value.shape)} {value.dtype} tensor failed ({error}); falling back to pageable, "
                "synchronous copies. Free host RAM, lower prefetch_factor/num_workers, or the batch size.",
            )
            self.pin = False
            return value

    def _to_device(self, value: Any) -> Any:
        return value.to(self.device, non_blocking=True)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)
