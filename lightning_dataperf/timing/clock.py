"""Per-step timing that stays correct under asynchronous CUDA: events read back lazily, never a sync."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["StepClock", "StepTiming"]

_MS_PER_S = 1e3


@dataclass(frozen=True, slots=True)
class StepTiming:
    """The measured times of one step, in seconds.

    Attributes:
        step: the step or batch index the figures belong to.
        data_wait: host time blocked in the loader's ``next()``.
        transfer: host-to-device copy (between the fetch and the step start; device time on CUDA).
        compute: the step's work (forward, backward, optimizer): host time on the CPU; on CUDA the step's
            device span (first to last of its work on the compute stream), which also holds the gaps in
            which the GPU waited for the host to launch kernels (see :attr:`device_span`).
        step_time: wall time since the previous step ended; ``None`` for the first step after a break.
        device_step_time: device time since the previous step's work ended (CUDA only).
        device_idle: time the device sat idle waiting for this step's input (CUDA only).
        samples: number of samples in the batch, if known.
        first_of_epoch: the data wait of this step is epoch start-up, not steady state.
        on_device: the figures come from CUDA events (device timeline), not host clocks.
    """

    step: int
    data_wait: float
    transfer: float
    compute: float
    step_time: float | None
    device_step_time: float | None = None
    device_idle: float | None = None
    samples: int | None = None
    first_of_epoch: bool = False
    on_device: bool = False

    @property
    def host_compute(self) -> float | None:
        """The step's work timed on the host (no device timeline): ``Time/Compute``."""
        return None if self.on_device else self.compute

    @property
    def device_span(self) -> float | None:
        """CUDA: the step's span on the device, GPU busy time plus host gaps: ``Time/DeviceSpan``."""
        return self.compute if self.on_device else None

    @property
    def input_stall(self) -> float | None:
        """Time lost to input in this step: device idle on CUDA, host data wait elsewhere."""
        return self.device_idle if self.device_step_time is not None else self.data_wait

    @property
    def stall_base(self) -> float | None:
        """The step time the input stall is a share of (device step time on CUDA)."""
        return self.device_step_time if self.device_step_time is not None else self.step_time


@dataclass(slots=True)
class _PendingStep:
    step: int
    data_wait: float
    host_transfer: float
    host_compute: float
    step_time: float | None
    samples: int | None
    first_of_epoch: bool
    ready: torch.cuda.Event | None = None
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
    previous_end: torch.cuda.Event | None = None


class StepClock:
    """Collects :class:`StepTiming` records without ever synchronising the device per step.

    Args:
        device: the device the steps run on. CUDA devices are timed with events; anything else with
            host clocks.
        clock: host clock in seconds (injectable for tests).

    Example::

        clock = StepClock(torch.device("cuda", 0))
        for step, batch in enumerate(loader_with_hooks):   # fetch_started()/fetch_finished() around next()
            clock.step_started()
            loss = model(batch.cuda(non_blocking=True)).sum(); loss.backward()
            clock.step_finished(step, samples=len(batch))
            for timing in clock.completed():                # figures of steps the GPU has finished
                print(timing.compute, timing.device_idle)
    """

    def __init__(self, device: torch.device | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = device
        self.uses_cuda_events = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self._clock = clock
        self._pending: deque[_PendingStep] = deque()
        self._fetch_start: float | None = None
        self._fetch_end: float | None = None
        self._ready_event: torch.cuda.Event | None = None
        self._step_start: float | None = None
        self._start_event: torch.cuda.Event | None = None
        self._previous_end: float | None = None
        self._previous_end_event: torch.cuda.Event | None = None
        self._first_of_epoch = False

    # -- host-side notifications -------------------------------------------------------------
    def fetch_started(self) -> None:
        self._fetch_start = self._clock()

    def fetch_finished(self) -> None:
        self._fetch_end = self._clock()
        if self.uses_cuda_events:
            self._ready_event = self._record_event()

    def step_started(self) -> None:
        self._step_start = self._clock()
        if self.uses_cuda_events:
            self._start_event = self._record_event()

    def step_finished(self, step: int, samples: int | None = None) -> None:
        """Close the step begun by :meth:`step_started`. Unmatched calls are ignored."""
        if self._step_start is None:
            return
        now = self._clock()
        end_event = self._record_event() if self.uses_cuda_events else None
        fetched = self._fetch_start is not None and self._fetch_end is not None
        fetch_start = self._fetch_start if fetched else self._step_start
        fetch_end = self._fetch_end if fetched else self._step_start
        assert fetch_start is not None and fetch_end is not None
        self._pending.append(
            _PendingStep(  # positional: this runs every step
                step,
                fetch_end - fetch_start,
                max(0.0, self._step_start - fetch_end),
                now - self._step_start,
                None if self._previous_end is None else now - self._previous_end,
                samples,
                self._first_of_epoch,
                self._ready_event if fetched else self._start_event,
                self._start_event,
                end_event,
                self._previous_end_event,
            )
        )
        self._previous_end, self._previous_end_event = now, end_event
        self._first_of_epoch = False
        self._fetch_start = self._fetch_end = self._step_start = None
        self._ready_event = self._start_event = None

    def step_skipped(self) -> None:
        """The batch begun is no step (Lightning skipped it: a ``None`` batch, or ``training_step`` returned
        ``None``): its fetch and start are forgotten, and the next step is timed from now, without it."""
        self._previous_end = self._clock()
        if self.uses_cuda_events:
            self._previous_end_event = self._record_event()
        self._fetch_start = self._fetch_end = self._step_start = None
        self._ready_event = self._start_event = None

    def break_continuity(self, new_epoch: bool = False) -> None:
        """Forget the previous step, e.g. after a validation run or at an epoch start.

        The next step then reports no step time or device idle (the gap is not steady-state time).
        """
        self._previous_end = None
        self._previous_end_event = None
        if new_epoch:
            self._first_of_epoch = True

    # -- read-back ----------------------------------------------------------------------------
    def completed(self) -> list[StepTiming]:
        """Figures of the steps whose device work has finished, oldest first. Never blocks."""
        done: list[StepTiming] = []
        while self._pending and self._is_finished(self._pending[0]):
            done.append(self._resolve(self._pending.popleft()))
        return done

    def flush(self) -> list[StepTiming]:
        """All outstanding figures. Waits once for the last step's end event (use at epoch ends only)."""
        if self._pending and self._pending[-1].end is not None:
            self._pending[-1].end.synchronize()
        return self.completed()

    def reset(self) -> None:
        """Drop every pending record and all state (teardown, exceptions)."""
        self._pending.clear()
        self.break_continuity()
        self._first_of_epoch = False
        self._fetch_start = self._fetch_end = self._step_start = None
        self._ready_event = self._start_event = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- internals ----------------------------------------------------------------------------
    def _record_event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    @staticmethod
    def _is_finished(pending: _PendingStep) -> bool:
        return pending.end is None or pending.end.query()

    @staticmethod
    def _resolve(pending: _PendingStep) -> StepTiming:
        if pending.end is None:
            return StepTiming(
                step=pending.step,
                data_wait=pending.data_wait,
                transfer=pending.host_transfer,
                compute=pending.host_compute,
                step_time=pending.step_time,
                samples=pending.samples,
                first_of_epoch=pending.first_of_epoch,
            )
        assert pending.ready is not None and pending.start is not None
        previous_end = pending.previous_end
        return StepTiming(
            step=pending.step,
            data_wait=pending.data_wait,
            transfer=pending.ready.elapsed_time(pending.start) / _MS_PER_S,
            compute=pending.start.elapsed_time(pending.end) / _MS_PER_S,
            step_time=pending.step_time,
            device_step_time=None if previous_end is None else previous_end.elapsed_time(pending.end) / _MS_PER_S,
            device_idle=None if previous_end is None else previous_end.elapsed_time(pending.ready) / _MS_PER_S,
            samples=pending.samples,
            first_of_epoch=pending.first_of_epoch,
            on_device=True,
        )
