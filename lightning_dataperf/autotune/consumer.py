"""What an autotune trial does with each batch: the transfer training will use, then a step as busy as training.

A trial that only counted arrivals would measure a loader nobody trains with (docs/autotune.md, section 1).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lightning_dataperf._lightning_hooks import cuda_sleep
from lightning_dataperf.batches import map_tensors

__all__ = ["Consumer", "TransferPath", "gpu_sleep_cycles_per_second"]

#: Steps the host may run ahead of the device before a trial waits (training is bounded the same way
#: by its own synchronisation points and the caching allocator).
MAX_STEPS_AHEAD = 2
_CYCLES_PER_SECOND: dict[int, float] = {}


@dataclass(frozen=True)
class TransferPath:
    """How training moves and consumes a batch; what each trial runs every batch through.

    Args:
        device: where batches go (``None``: they stay on the host, as on a CPU run).
        side_stream: copy on a side stream (``SideStreamTransferMixin`` strategies); the loader then
            hands over pinned batches, so ``pin_memory=False`` is not searched.
        pin_in_main: with ``side_stream``, pin unpinned batches in the main thread (the strategy's ``pin``).
        min_bytes: with ``side_stream``, batches below this take the stock copy (the strategy's ``min_bytes``).
        device_transform: run on the device batch after the copy (the strategy's ``device_transform``).
        step_seconds: the model step's device time (CUDA: ``torch.cuda._sleep`` of that long; on the host:
            a busy-wait of the main thread).
        host_step_seconds: main-thread host work per step on top (kernel launches, Python, logging): a busy-wait.
        step_fn: your own step, called with the device batch (e.g. forward + backward of the model); used
            instead of ``step_seconds``.

    Example::

        path = TransferPath(device=torch.device("cuda", 0), side_stream=True, step_seconds=0.011)
        consume = path.consumer()
        for batch in loader:
            consume(batch)          # copy (side stream), device transform, 11 ms of GPU "step"
        consume.finish()            # waits for the device
    """

    device: torch.device | None = None
    side_stream: bool = False
    pin_in_main: bool = True
    min_bytes: int = 2 * 2**20
    device_transform: Callable[[Any], Any] | None = None
    step_seconds: float = 0.0
    host_step_seconds: float = 0.0
    step_fn: Callable[[Any], Any] | None = None

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def pin_choices(self) -> tuple[bool, ...]:
        """The ``pin_memory`` values worth a trial: both for the stock CUDA copy, pinned only for the side stream."""
        if not self.cuda:
            return (False,)
        return (True,) if self.side_stream else (True, False)

    def describe(self) -> str:
        """Everything about the path that changes the answer (part of the cache key)."""
        if self.device is None or self.device.type == "cpu":
            copy = "host"
        elif self.side_stream:
            copy = f"side_stream(pin={self.pin_in_main},min_bytes={self.min_bytes})"
        else:
            copy = f"stock_copy({self.device.type})"
        parts = [copy]
        if self.device_transform is not None:
            parts.append(f"transform={_name(self.device_transform)}")
        if self.step_fn is not None:
            parts.append(f"step={_name(self.step_fn)}")
        elif self.step_seconds:
            parts.append(f"step={self.step_seconds * 1e3:.2f}ms")
        if self.host_step_seconds:
            parts.append(f"host_step={self.host_step_seconds * 1e3:.2f}ms")
        return ",".join(parts)

    def consumer(self) -> Consumer:
        return Consumer(self)


class Consumer:
    """One trial's consumer: call it with each host batch, then :meth:`finish`."""

    def __init__(self, path: TransferPath) -> None:
        self.path = path
        self._copier = None
        self._pending: Any = None  # the side stream's in-flight batch (lookahead 1)
        self._marks: collections.deque[torch.cuda.Event] = collections.deque()
        if path.cuda and path.side_stream:
            from lightning_dataperf.transfer.copier import SideStreamCopier

            self._copier = SideStreamCopier(
                path.device, pin=path.pin_in_main, device_transform=path.device_transform, min_bytes=path.min_bytes
            )
        self._cycles = gpu_sleep_cycles_per_second(path.device) if path.cuda and path.step_seconds else 0.0

    def __call__(self, batch: Any) -> None:
        path = self.path
        if self._copier is not None:
            inflight = self._copier.issue(batch)
            previous, self._pending = self._pending, inflight
            if previous is None:
                return
            self._step(self._copier.hand_over(previous))
            return
        if path.cuda:
            batch = map_tensors(batch, lambda tensor: tensor.to(path.device, non_blocking=True))
            if path.device_transform is not None:
                batch = path.device_transform(batch)
        self._step(batch)

    def finish(self) -> None:
        """Run the step of the batch still in flight and wait for the device."""
        if self._copier is not None and self._pending is not None:
            self._step(self._copier.hand_over(self._pending))
            self._pending = None
        if self.path.cuda:
            torch.cuda.synchronize(self.path.device)
        self._marks.clear()

    def _step(self, batch: Any) -> None:
        path = self.path
        if path.step_fn is not None:
            path.step_fn(batch)
        elif path.step_seconds and path.cuda:
            cuda_sleep(int(path.step_seconds * self._cycles))
        elif path.step_seconds:
            _busy_wait(path.step_seconds)
        if path.host_step_seconds:
            _busy_wait(path.host_step_seconds)
        if path.cuda:
            mark = torch.cuda.Event()
            mark.record()
            self._marks.append(mark)
            if len(self._marks) > MAX_STEPS_AHEAD:
                self._marks.popleft().synchronize()


def _busy_wait(seconds: float) -> None:
    """Keep the main thread busy (a CPU-bound step), as training does, so competing workers slow it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def gpu_sleep_cycles_per_second(device: torch.device | None) -> float:
    """Cycles of ``torch.cuda._sleep`` per second on ``device``, calibrated once with events."""
    index = torch.device(device).index or 0 if device is not None else 0
    if index not in _CYCLES_PER_SECOND:
        with torch.cuda.device(index):
            cuda_sleep(1_000_000)  # warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cycles = 50_000_000
            start.record()
            cuda_sleep(cycles)
            end.record()
            end.synchronize()
            _CYCLES_PER_SECOND[index] = cycles / (start.elapsed_time(end) / 1e3)
    return _CYCLES_PER_SECOND[index]


def _name(value: Any) -> str:
    return getattr(value, "__qualname__", None) or type(value).__qualname__
