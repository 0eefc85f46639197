"""Host gap: how much of a CUDA step's device span the GPU spent waiting for the host, not computing.

Events cannot see a late kernel launch, so a few steps per epoch are profiled (docs/timing.md, section 2).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = ["HostGapProbe", "HostGapStats", "split_device_span"]


@dataclass(frozen=True)
class HostGapStats:
    """Means per profiled step, in seconds: device span = GPU busy + host gap."""

    steps: int
    span_s: float
    gpu_busy_s: float
    host_gap_s: float
    first_step: int

    profiled_span_s: float | None = None  # the recorded steps' own span (longer: the profiler costs launches)
    main_cpu_fraction: float | None = None  # the training thread's CPU time over wall time in the recorded steps
    main_runqueue_s: float | None = None  # per step, time the training thread was runnable but waited for a CPU
    other_threads_kept: bool = False  # the profiler's thread ids were not recognised: work on every stream counted

    def with_span(self, span_s: float) -> HostGapStats:
        """The same busy time within the span of the steps the profiler did not slow down."""
        gap = max(0.0, span_s - self.gpu_busy_s)
        return dataclasses.replace(self, span_s=span_s, host_gap_s=gap, profiled_span_s=self.span_s)

    #: The training thread waiting for a CPU (run queue) for at least this share of the host gap is starved.
    STARVED_SHARE_OF_GAP = 0.3

    @property
    def training_thread_starved(self) -> bool:
        """Measured: the training thread waited on a run queue for much of the gap (busy workers took its CPU)."""
        queued = self.main_runqueue_s
        return queued is not None and self.host_gap_s > 0 and queued >= self.STARVED_SHARE_OF_GAP * self.host_gap_s

    @property
    def gap_share(self) -> float:
        return self.host_gap_s / self.span_s if self.span_s > 0 else 0.0

    def format(self) -> str:
        last = self.first_step + self.steps - 1
        caveat = "; work of all streams counted, thread ids not recognised" if self.other_threads_kept else ""
        return (
            f"GPU busy {1e3 * self.gpu_busy_s:.2f} ms + host gap {1e3 * self.host_gap_s:.2f} ms of a "
            f"{1e3 * self.span_s:.2f} ms step span (GPU busy from profiled steps {self.first_step}-{last}{caveat})"
        )


def split_device_span(intervals: list[tuple[int, int]]) -> tuple[int, int]:
    """``(span, busy)`` of device intervals ``(start_ns, end_ns)``: first start to last end, and their union."""
    if not intervals:
        return 0, 0
    ordered = sorted(intervals)
    busy, current_start, current_end = 0, ordered[0][0], ordered[0][1]
    for start, end in ordered[1:]:
        if start > current_end:
            busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    busy += current_end - current_start
    span = max(end for _, end in ordered) - ordered[0][0]
    return span, busy


class HostGapProbe:
    """Profiles ``steps`` consecutive training steps from ``start_step`` of each epoch (CUDA only).

    Args:
        start_step: the first step of an epoch to profile (after warm-up).
        steps: how many consecutive steps to profile.

    Example::

        probe = HostGapProbe(start_step=20, steps=8)
        ...  # in the training loop: probe.step_started(i) / probe.step_finished(i)
        probe.result()        # HostGapStats(steps=8, span_s=0.0193, gpu_busy_s=0.0109, host_gap_s=0.0084)
    """

    def __init__(self, start_step: int = 20, steps: int = 8) -> None:
        if start_step < 0 or steps < 1:
            raise ValueError(f"HostGapProbe(start_step={start_step}, steps={steps}): need start_step >= 0, steps >= 1.")
        self.start_step, self.steps = start_step, steps
        self.disabled: str | None = None
        self._profiler: Any = None
        self._windows: list[tuple[int, int]] = []  # host (realtime ns) window of each profiled step
        self._cpu: list[float] = []  # the training thread's CPU seconds in each window
        self._runqueue: list[float] = []  # its seconds waiting for a CPU in each window (Linux schedstat)
        self._open: int | None = None
        self._open_cpu = 0.0
        self._open_runqueue: float | None = None
        self._result: HostGapStats | None = None
        self._threads: frozenset[int] = frozenset()  # the training thread's ids, as a profiler may name it

    @property
    def active(self) -> bool:
        return self._profiler is not None

    @property
    def active_this_epoch(self) -> bool:
        """Whether the profiler ran (or runs) in this epoch."""
        return self._profiler is not None or self._result is not None or bool(self._windows)

    def reset_epoch(self) -> None:
        self._stop()
        self._windows, self._cpu, self._runqueue, self._open, self._result = [], [], [], None, None

    @property
    def covered(self) -> range:
        """The steps of an epoch whose figures the probe disturbs: its warm-up, the recorded ones, the next."""
        return range(max(0, self.start_step - 1), self.start_step + self.steps + 1)

    def step_started(self, step: int) -> None:
        if self.disabled is not None:
            return
        if step == max(0, self.start_step - 1) and self._profiler is None and self._result is None:
            ident = threading.get_ident()
            self._threads = frozenset({threading.get_native_id(), ident, ident & 0xFFFFFFFF})
            self._start()
        if self._profiler is not None and step >= self.start_step:
            self._open, self._open_cpu, self._open_runqueue = time.time_ns(), time.thread_time(), _runqueue_wait()

    def step_skipped(self) -> None:
        """The step begun was skipped (no step): its window is not recorded."""
        self._open = None

    def step_finished(self, step: int) -> bool:
        """Close the step; ``True`` when this ended the probe (the profiler stopped, waiting for the GPU)."""
        if self._profiler is None or self._open is None:
            return False
        self._windows.append((self._open, time.time_ns()))
        self._cpu.append(time.thread_time() - self._open_cpu)
        waited = _runqueue_wait()
        if waited is not None and self._open_runqueue is not None:
            self._runqueue.append(waited - self._open_runqueue)
        self._open = None
        if len(self._windows) < self.steps:
            return False
        self._result = self._finish()
        return True

    def result(self) -> HostGapStats | None:
        return self._result

    def _start(self) -> None:
        try:
            from torch.profiler import ProfilerActivity, profile

            self._profiler = profile(activities=[ProfilerActivity.CUDA])
            self._profiler.__enter__()
        except Exception as error:  # no CUPTI, another profiler running: say so once, never stop training
            self._profiler = None
            self.disabled = f"{type(error).__name__}: {error}"
            warnings.warn(
                f"DataPerf host-gap probe is off ({self.disabled}); the host gap is not measured.", stacklevel=3
            )

    def end_epoch(self) -> None:
        """The epoch ended inside the recorded steps (a short epoch): stop, keep no partial result."""
        if self._profiler is not None:
            self._stop()
            self._windows, self._open = [], None

    def _stop(self) -> Any:
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            try:
                profiler.__exit__(None, None, None)
            except Exception as error:  # never let the probe stop training
                self.disabled = f"{type(error).__name__}: {error}"
                warnings.warn(f"DataPerf host-gap probe is off: stopping the profiler failed ({error}).", stacklevel=3)
                return None
        return profiler

    def _finish(self) -> HostGapStats | None:
        try:
            profiler = self._stop()
            if profiler is None:
                return None
            events = list(profiler.profiler.kineto_results.events())
            stats = _stats(events, self._windows, self.start_step, self._threads)
            wall = sum(closed - opened for opened, closed in self._windows) / 1e9
            if stats is not None and wall > 0:
                stats = dataclasses.replace(stats, main_cpu_fraction=min(1.0, sum(self._cpu) / wall))
            if stats is not None and self._runqueue and any(self._runqueue):
                stats = dataclasses.replace(stats, main_runqueue_s=sum(self._runqueue) / len(self._runqueue))
            return stats
        except Exception as error:  # a profiler this code does not know: say so once, never stop training
            self.disabled = f"profiler results unreadable ({type(error).__name__}: {error})"
            warnings.warn(f"DataPerf host-gap probe is off: {self.disabled}.", stacklevel=3)
            return None


def _runqueue_wait() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU (``/proc/thread-self/schedstat``)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _stats(
    events: list[Any], windows: list[tuple[int, int]], first_step: int, threads: frozenset[int] = frozenset()
) -> HostGapStats | None:
    """Per step: the step's device work launched inside its host window -> its device span and busy union.

    The step's work is what runs on the streams the training thread (``threads``: its ids) launches on,
    whichever thread queued it (autograd runs the backward pass on its own device thread, on the same
    stream), and on the other streams that such a thread launches on (DDP's all-reduce on NCCL's stream,
    queued from autograd's thread). A thread that never launches on the step's streams (a GPU-decode
    thread on its own stream) is not the step's. Side-stream copies for the next batch are queued during
    the fetch, outside the step's window. If no launch carries one of the ids (a profiler naming threads
    otherwise), all work is kept and the result says so.
    """
    launches: dict[int, tuple[int, int]] = {}  # correlation id -> (launch time (ns, host clock), thread id)
    device: list[tuple[int, int, int, int]] = []  # (correlation id, start, end, stream) of device work
    for event in events:
        name = event.name()
        if str(event.device_type()).endswith("CUDA"):  # work on the GPU: kernels, copies, memsets
            start = event.start_ns()
            device.append((event.correlation_id(), start, start + event.duration_ns(), event.device_resource_id()))
        elif "Launch" in name or "Memcpy" in name or "Memset" in name:  # the runtime call that queued it
            # Kineto names the launching thread in a runtime event's resource id (pthread_self, low 32 bits, as
            # a signed int32); its thread ids are its own sequence numbers (1 for every thread on torch 2.11).
            launches[event.correlation_id()] = (event.start_ns(), event.device_resource_id() & 0xFFFFFFFF)
    stream_of = {correlation: stream for correlation, _, _, stream in device}  # a GPU event's resource id: its stream
    streams = {stream_of[c] for c, (_, thread) in launches.items() if thread in threads and c in stream_of}
    kept_all = not streams
    # The step's threads: the training thread and those that also launch on its streams (autograd's backward
    # thread); their streams are the step's too (DDP's all-reduce, which that thread queues on NCCL's stream).
    helpers = {thread for c, (_, thread) in launches.items() if stream_of.get(c) in streams}
    streams |= {stream_of[c] for c, (_, thread) in launches.items() if thread in helpers and c in stream_of}
    launches_at = {correlation: at for correlation, (at, _) in launches.items()}
    device = [item for item in device if kept_all or item[3] in streams]
    per_step: list[list[tuple[int, int]]] = [[] for _ in windows]
    for correlation, start, end, _ in device:
        launched = launches_at.get(correlation)
        if launched is None:
            continue
        for index, (opened, closed) in enumerate(windows):
            if opened <= launched <= closed:
                per_step[index].append((start, end))
                break
    splits = [split_device_span(intervals) for intervals in per_step if intervals]
    if not splits:
        return None
    count = len(splits)
    span = sum(span for span, _ in splits) / count / 1e9
    busy = sum(busy for _, busy in splits) / count / 1e9
    return HostGapStats(
        steps=count,
        span_s=span,
        gpu_busy_s=busy,
        host_gap_s=max(0.0, span - busy),
        first_step=first_step,
        other_threads_kept=kept_all and bool(threads),
    )
