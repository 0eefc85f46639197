"""Side-stream host-to-device copies that overlap the previous step's compute.

Stock Lightning copies each batch with ``non_blocking=True`` on the compute stream, so the copy runs
between two steps' kernels and a step costs about compute + copy. Here every tensor of the batch is
copied from pinned memory on one side CUDA stream per device, ``lookahead`` batches ahead, and the
compute stream waits for the copy *on the GPU* (``wait_event``), so a step costs about
max(compute, copy). Memory stays safe across streams: the device memory for a copy comes from the
compute stream's pool and the side stream first waits (on the GPU) for the compute work queued so far,
so a block the step has just freed is not overwritten while queued kernels still read it; what is
allocated on the side stream itself (``.to()`` of other objects, ``device_transform`` outputs) is
marked with ``record_stream`` for the compute stream. PyTorch's pinned-host allocator keeps a source
block until its copy has finished.

Example::

    import lightning.pytorch as pl
    import lightning_dataperf  # registers the strategies

    trainer = pl.Trainer(accelerator="gpu", devices=1, strategy="side_stream")
    # or, with options / under DDP:
    trainer = pl.Trainer(accelerator="gpu", devices=4, strategy=SideStreamDDPStrategy(lookahead=2))

CPU and MPS runs fall back to Lightning's stock behaviour.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader
from typing_extensions import override

__all__ = [
    "CopyTiming",
    "SideStreamCopier",
    "SideStreamDDPStrategy",
    "SideStreamStrategy",
    "SideStreamTransferMixin",
    "copy_metrics",
    "map_tensors",
]

DeviceTransform = Callable[[Any], Any]
_T = TypeVar("_T")


def map_tensors(batch: Any, function: Callable[[Any], Any]) -> Any:
    """Apply ``function`` to every tensor (and every object with a ``.to()``) in a nested batch.

    Handles dicts and other mappings, lists, tuples, namedtuples and dataclasses; other leaves are
    returned unchanged.
    """
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {key: map_tensors(value, function) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(value, function) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(value, function) for value in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: map_tensors(getattr(batch, f.name), function) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **changes)
    if callable(getattr(batch, "to", None)) and not isinstance(batch, (str, bytes)):
        return function(batch)
    return batch


def _rebuild_mapping(original: Mapping, values: dict) -> Mapping:
    """Same mapping type where it can be built empty and filled (dict, OrderedDict, ...), else a dict."""
    try:
        rebuilt = type(original)()
        rebuilt.update(values)  # type: ignore[attr-defined]
    except (TypeError, AttributeError):
        return values
    return rebuilt


def iter_tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor in a nested batch (including tensor attributes of objects with ``.to()``).

    Walks the same structures as :func:`map_tensors` without rebuilding them.
    """
    found: list[torch.Tensor] = []
    _collect_tensors(batch, found)
    return found


def _collect_tensors(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _collect_tensors(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_tensors(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for member in dataclasses.fields(value):
            if member.init:
                _collect_tensors(getattr(value, member.name), found)
    elif callable(getattr(value, "to", None)) and not isinstance(value, (str, bytes)) and hasattr(value, "__dict__"):
        found.extend(attribute for attribute in vars(value).values() if isinstance(attribute, torch.Tensor))


@dataclass(frozen=True)
class CopyTiming:
    """One batch's copy on the side stream.

    Attributes:
        copy: seconds the copy took on the side stream.
        bytes: bytes copied.
        exposed: seconds the compute stream waited for the copy and the transform (not hidden behind compute).
        transform: seconds ``device_transform`` took on the side stream after the copy (0 without one).
    """

    copy: float
    bytes: int
    exposed: float
    transform: float = 0.0

    @property
    def hidden_fraction(self) -> float:
        """Share of the side stream's work for this batch (copy and transform) hidden behind compute."""
        busy = self.copy + self.transform
        return 1.0 if busy <= 0 else max(0.0, min(1.0, 1.0 - self.exposed / busy))


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
    """Reuses CUDA events: creating one costs the host more than recording it (~3.4 vs ~1 us on an H200 host).

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


def _check_copy_options(min_bytes: int, timing_every: int) -> None:
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
    ) -> None:
        _check_copy_options(min_bytes, timing_every)
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
        if host_bytes < self.min_bytes:
            return _InFlight(batch, None, host_bytes)
        timed = self._side_copies % self.timing_every == 0
        self._side_copies += 1
        start = self._events.take(timing=True) if timed else None
        copied = self._events.take(timing=True) if timed and self.device_transform is not None else None
        done = self._events.take(timing=timed)
        on_compute = self.allocate_on_compute if allocate_on_compute is None else allocate_on_compute
        compute = torch.cuda.current_stream(self._device_index)
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
        if inflight.copy_done is None:  # a small batch: the stock copy, on the compute stream
            batch = map_tensors(inflight.batch, self._to_device)
            return batch if self.device_transform is None else self.device_transform(batch)
        compute = torch.cuda.current_stream(self._device_index)
        if inflight.copy_start is None:
            compute.wait_event(inflight.copy_done)
            self._events.give(inflight.copy_done, timing=False)
        else:
            wait_start, wait_end = self._events.take(timing=True), self._events.take(timing=True)
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
        while self._handed_over and self._handed_over[0].wait_end.query():
            record = self._handed_over.popleft()
            copy_end = record.copy_end or record.copy_done
            copy = record.copy_start.elapsed_time(copy_end) / 1e3
            transform = 0.0 if record.copy_end is None else record.copy_end.elapsed_time(record.copy_done) / 1e3
            exposed = record.wait_start.elapsed_time(record.wait_end) / 1e3
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


class _LookaheadIterator(Iterator):
    """Yields batch N already on the device while batches N+1..N+depth are being copied."""

    def __init__(self, iterator: Iterator, copier: SideStreamCopier, depth: int) -> None:
        self._iterator = iterator
        self._copier = copier
        self._depth = depth
        self._queue: deque[_InFlight] = deque()
        self._exhausted = False
        self._error: BaseException | None = None

    def __next__(self) -> Any:
        while not self._exhausted and self._error is None and len(self._queue) <= self._depth:
            try:
                host_batch = next(self._iterator)
            except StopIteration:
                self._exhausted = True
            except Exception as error:  # hand over what is queued first; nothing is lost
                self._error = error
            else:
                self._queue.append(self._copier.issue(host_batch))
        if self._queue:
            return self._copier.hand_over(self._queue.popleft())
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        raise StopIteration

    def __getattr__(self, name: str) -> Any:  # public attributes of the wrapped iterator
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._iterator, name)


_LOOKAHEAD_CLASSES: dict[type, type] = {}


def _lookahead_class(loader_class: type[DataLoader]) -> type[DataLoader]:
    """A subclass of the user's DataLoader class whose iterator copies ahead (keeps isinstance checks)."""
    if loader_class not in _LOOKAHEAD_CLASSES:

        def __iter__(self: DataLoader) -> Iterator:  # noqa: N807
            inner = super(subclass, self).__iter__()
            return self._dataperf_make_iterator(inner)

        subclass = type(f"SideStream{loader_class.__name__}", (loader_class,), {"__iter__": __iter__})
        _LOOKAHEAD_CLASSES[loader_class] = subclass
    return _LOOKAHEAD_CLASSES[loader_class]


class _LookaheadIterable:
    """Wraps a non-DataLoader iterable; attributes are delegated to it."""

    def __init__(self, iterable: Any, make_iterator: Callable[[Iterator], Iterator]) -> None:
        self._iterable = iterable
        self._make_iterator = make_iterator

    def __iter__(self) -> Iterator:
        return self._make_iterator(iter(self._iterable))

    def __len__(self) -> int:
        return len(self._iterable)

    def __getattr__(self, name: str) -> Any:  # e.g. `sampler`, `dataset` of the wrapped iterable
        if name.startswith("__") or name in ("_iterable", "_make_iterator"):
            raise AttributeError(name)
        return getattr(self._iterable, name)


class SideStreamTransferMixin:
    """Adds side-stream, look-ahead host-to-device copies to a Lightning strategy.

    Put it first in the bases of your own strategy: ``class MyStrategy(SideStreamTransferMixin, DDPStrategy)``.

    Args:
        lookahead: batches copied ahead of the one being computed (default 1). With ``lookahead >= 1``
            the loader yields batches already on the device, so ``on_before_batch_transfer`` and a custom
            ``transfer_batch_to_device`` see device tensors; ``on_after_batch_transfer`` is unchanged.
            ``lookahead=0`` keeps the stock hook order (copy on the side stream inside
            ``batch_to_device``) but overlaps only with work the GPU still has queued.
        pin: pin unpinned host tensors in the main process (see :class:`SideStreamCopier`).
        device_transform: runs on the side stream after each copy, e.g. uint8 -> float and normalise.
        min_bytes: smaller batches are copied the stock way, on the compute stream (default 2 MiB; see
            :class:`SideStreamCopier`).
        timing_every: time one side-stream copy in this many (default 4) for DataPerfCallback's figures.

    Example::

        class MyStrategy(SideStreamTransferMixin, SingleDeviceStrategy):
            pass

        trainer = Trainer(accelerator="gpu", devices=1, strategy=MyStrategy(lookahead=2))
    """

    def __init__(
        self,
        *args: Any,
        lookahead: int = 1,
        pin: bool = True,
        device_transform: DeviceTransform | None = None,
        min_bytes: int = DEFAULT_MIN_BYTES,
        timing_every: int = DEFAULT_TIMING_EVERY,
        **kwargs: Any,
    ) -> None:
        if lookahead < 0:
            raise ValueError(f"lookahead={lookahead} must be >= 0 (0 copies in batch_to_device, 1+ copies ahead).")
        _check_copy_options(min_bytes, timing_every)  # here too: the copier itself is created on first use
        super().__init__(*args, **kwargs)
        self.lookahead = lookahead
        self.pin = pin
        self.device_transform = device_transform
        self.min_bytes = min_bytes
        self.timing_every = timing_every
        self._copier: SideStreamCopier | None = None
        self._hooks_warned = False

    @property
    def side_stream_active(self) -> bool:
        return self.root_device.type == "cuda" and torch.cuda.is_available()  # type: ignore[attr-defined]

    @property
    def copier(self) -> SideStreamCopier:
        """The side-stream copier of this rank's device, created once for the run."""
        if self._copier is None:
            self._copier = SideStreamCopier(
                self.root_device,  # type: ignore[attr-defined]
                self.pin,
                self.device_transform,
                min_bytes=self.min_bytes,
                timing_every=self.timing_every,
            )
        return self._copier

    def pop_copy_timings(self) -> list[CopyTiming]:
        """Copy timings completed since the last call (used by DataPerfCallback)."""
        return [] if self._copier is None else self._copier.completed()

    @override
    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)  # type: ignore[misc]
        if not self.side_stream_active or self.lookahead == 0:
            return dataloader
        self._warn_about_hooks()

        def make_iterator(inner: Iterator) -> Iterator:
            return _LookaheadIterator(inner, self.copier, self.lookahead)

        if isinstance(dataloader, DataLoader):
            dataloader.__class__ = _lookahead_class(type(dataloader))
            dataloader._dataperf_make_iterator = make_iterator  # type: ignore[attr-defined]
            return dataloader
        return _LookaheadIterable(dataloader, make_iterator)

    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        if self.side_stream_active and self.lookahead == 0 and (device is None or device == self.root_device):  # type: ignore[attr-defined]
            # Copied now, for this step: side-stream memory keeps the overlap with already queued work.
            batch = self.copier.hand_over(self.copier.issue(batch, allocate_on_compute=False))
        return super().batch_to_device(batch, device, dataloader_idx)  # type: ignore[misc]

    @override
    def teardown(self) -> None:
        self._copier = None
        super().teardown()  # type: ignore[misc]

    def _warn_about_hooks(self) -> None:
        module = getattr(self, "lightning_module", None)
        if self._hooks_warned or module is None:
            return
        overridden = [
            name for name in ("on_before_batch_transfer", "transfer_batch_to_device") if is_overridden(name, module)
        ]
        if overridden:
            self._hooks_warned = True
            warnings.warn(
                f"{', '.join(overridden)} is overridden: with side-stream look-ahead it receives batches already on "
                "the GPU. Move host-side batch edits into the DataLoader's collate_fn, or use lookahead=0 to keep "
                "the stock hook order.",
                stacklevel=2,
            )


class SideStreamStrategy(SideStreamTransferMixin, SingleDeviceStrategy):
    """Single-device training with side-stream look-ahead copies. Registered as ``"side_stream"``.

    Example::

        Trainer(accelerator="gpu", devices=1, strategy="side_stream")
        Trainer(accelerator="gpu", devices=1, strategy=SideStreamStrategy(lookahead=2))
    """

    strategy_name = "side_stream"

    def __init__(self, device: Any = None, **kwargs: Any) -> None:
        super().__init__(device=device if device is not None else "cpu", **kwargs)
        self._device_given = device is not None
        #: filled by Lightning's accelerator connector when the device was not given
        self.parallel_devices: list[torch.device] | None = None

    @property
    def root_device(self) -> torch.device:
        if not self._device_given and self.parallel_devices:
            return self.parallel_devices[0]
        return self._root_device


class SideStreamDDPStrategy(SideStreamTransferMixin, DDPStrategy):
    """DDP with side-stream look-ahead copies, one stream per rank's device. Registered as ``"ddp_side_stream"``.

    Example::

        Trainer(accelerator="gpu", devices=8, strategy="ddp_side_stream")
    """

    strategy_name = "ddp_side_stream"


def copy_metrics(copies: Sequence[CopyTiming], prefix: str = "") -> dict[str, float]:
    """Side-stream copy figures for the loggers: mean copy time, effective GB/s, hidden fraction.

    ``Transfer/GBps`` is bytes over copy time alone; ``Transfer/hidden_fraction`` is the share of the side
    stream's work (copy and ``device_transform``, whose mean is ``Transfer/transform_s``) that the compute
    stream did not wait for.
    """
    if not copies:
        return {}
    copy_time = sum(copy.copy for copy in copies)
    transform_time = sum(copy.transform for copy in copies)
    exposed = sum(copy.exposed for copy in copies)
    busy = copy_time + transform_time
    metrics = {
        f"{prefix}Time/Transfer": copy_time / len(copies),
        f"{prefix}Transfer/exposed_s": exposed / len(copies),
        f"{prefix}Transfer/hidden_fraction": 1.0 if busy <= 0 else max(0.0, 1.0 - exposed / busy),
    }
    if copy_time > 0:
        metrics[f"{prefix}Transfer/GBps"] = sum(copy.bytes for copy in copies) / copy_time / 1e9
    if transform_time > 0:
        metrics[f"{prefix}Transfer/transform_s"] = transform_time / len(copies)
    return metrics


def _register() -> None:
    if "side_stream" not in StrategyRegistry:
        StrategyRegistry.register("side_stream", SideStreamStrategy, description=SideStreamStrategy.__doc__)
    if "ddp_side_stream" not in StrategyRegistry:
        StrategyRegistry.register(
            "ddp_side_stream", SideStreamDDPStrategy, description=SideStreamDDPStrategy.__doc__, start_method="popen"
        )


_register()
