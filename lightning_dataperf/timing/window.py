"""Pure reductions of a window of :class:`~lightning_dataperf.timing.clock.StepTiming` records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from lightning_dataperf import tags
from lightning_dataperf.tags import Stage
from lightning_dataperf.timing.summary import Stall

if TYPE_CHECKING:
    from lightning_dataperf.timing.clock import StepTiming

__all__ = [
    "STALL_MAX_SHARE",
    "TIMINGS",
    "find_stalls",
    "stall_totals",
    "steady_values",
    "throughput_totals",
    "window_metrics",
]

#: Logged name -> StepTiming attribute. Data wait, step time and device idle of an epoch's first step
#: are start-up cost, reported as ``Time/EpochStart`` and kept out of these.
TIMINGS: dict[str, str] = {
    tags.DATA_LOADING: "data_wait",
    tags.TRANSFER: "transfer",
    tags.COMPUTE: "host_compute",  # CPU; on CUDA Time/Compute is the GPU's busy time, from the host-gap probe
    tags.DEVICE_SPAN: "device_span",
    tags.STEP: "step_time",
    tags.DEVICE_IDLE: "device_idle",
}
_STARTUP_FIELDS = {"data_wait", "step_time", "device_idle", "device_step_time"}


def steady_values(timings: Iterable[StepTiming], attribute: str) -> list[float]:
    """The values of one attribute, leaving out ``None`` and epoch start-up values."""
    values = []
    for timing in timings:
        if timing.first_of_epoch and attribute in _STARTUP_FIELDS:
            continue
        value = getattr(timing, attribute)
        if value is not None:
            values.append(float(value))
    return values


def stall_totals(timings: Iterable[StepTiming]) -> tuple[float, float]:
    """(time lost to input, step time it is a share of), summed over steady-state steps."""
    lost = base = 0.0
    for timing in timings:
        if timing.first_of_epoch or timing.input_stall is None or timing.stall_base is None:
            continue
        lost += timing.input_stall
        base += timing.stall_base
    return lost, base


#: A step whose data wait exceeds the epoch's median by this much (and by STALL_FACTOR times) is a stall...
STALL_MIN_S, STALL_FACTOR = 0.25, 10.0
#: ... as long as such steps are rare (at most this share of the steps, or two); otherwise they are the steady state.
STALL_MAX_SHARE = 0.05


def find_stalls(timings: Sequence[StepTiming]) -> list[Stall]:
    """The rare steps whose data wait is far above the epoch's median (robust: one stall, not a trend)."""
    steady = [timing for timing in timings if not timing.first_of_epoch]
    # Too few steps for a median to tell one stall from the steady state.
    if len(steady) < 5:
        return []
    waits = sorted(timing.data_wait for timing in steady)
    median = waits[len(waits) // 2]
    threshold = median + max(STALL_MIN_S, STALL_FACTOR * median)
    stalls, elapsed = [], 0.0
    for timing in steady:
        if timing.data_wait > threshold:
            stalls.append(Stall(timing.step, timing.data_wait, elapsed))
        # A step after a break has no step time; its parts stand in for it.
        elapsed += timing.step_time or (timing.data_wait + timing.compute)
    return stalls if len(stalls) <= max(2, STALL_MAX_SHARE * len(steady)) else []


def throughput_totals(timings: Iterable[StepTiming]) -> tuple[int, float]:
    """(samples, seconds) over steady-state steps whose size and step time are known."""
    samples, seconds = 0, 0.0
    for timing in timings:
        if timing.first_of_epoch or timing.samples is None or timing.step_time is None:
            continue
        samples += timing.samples
        seconds += timing.step_time
    return samples, seconds


def window_metrics(timings: Sequence[StepTiming], stage: Stage = Stage.TRAIN) -> dict[str, float]:
    """Mean (and max) of each timing over ``timings``, plus throughput and input-stall fraction."""
    metrics: dict[str, float] = {}
    for name, attribute in TIMINGS.items():
        values = steady_values(timings, attribute)
        if values:
            metrics[tags.time(name, stage)] = sum(values) / len(values)
            metrics[tags.time(name, stage) + "_max"] = max(values)
    samples, seconds = throughput_totals(timings)
    if seconds > 0:
        metrics[stage.prefix + tags.SAMPLES_PER_SEC] = samples / seconds
    lost, base = stall_totals(timings)
    if base > 0:
        metrics[stage.prefix + tags.INPUT_STALL] = min(1.0, lost / base)
    return metrics
