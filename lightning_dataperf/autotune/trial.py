"""What one autotune trial measured, and how trials are ranked against each other.

Example::

    trial = Trial(num_workers=8, prefetch_factor=2, pin_memory=True, batches_per_sec=41.5, batches=60)
    rate, error, used = steady_rate(arrival_times, round_size=8)
    cheapest_near(trials, share=0.98)       # the cheapest configuration within 2% of the fastest
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lightning_dataperf.autotune.noise import DECIDED_GAP, DECIDED_SE, TIE_BAND, gap, slower_for_sure

__all__ = [
    "BUDGET_REFUSAL",
    "CONFIRM_BAND",
    "CPU_OVERSUBSCRIPTION",
    "DATASET_REFUSAL",
    "DECIDED_GAP",
    "DECIDED_SE",
    "FD_SHARE",
    "MIN_ROUNDS",
    "MIN_STEADY_BATCHES",
    "OUTLIER_SHARE",
    "TIE_BAND",
    "Config",
    "Limits",
    "Trial",
    "TrialListener",
    "cheapest_near",
    "confirmation_candidates",
    "decided",
    "made_rate",
    "margin",
    "percent_change",
    "rated",
    "steady_rate",
    "trial_rate",
]

#: The cheapest trial within this share of the best is re-measured too: the choice is the cheapest
#: configuration within noise of the best, and one unlucky measurement must not rule it out.
CONFIRM_BAND = 0.7
#: A trial slower than this share of both its neighbours (:func:`~lightning_dataperf.autotune.runner.repeat_outliers`),
#: or a step up slower than this share of the best, is measured again: an artefact until seen twice.
OUTLIER_SHARE = 0.8
#: A loader configuration as trials are keyed: ``(num_workers, prefetch_factor, pin_memory)``.
Config = tuple[int, int | None, bool]
#: Fewest rounds of ``num_workers`` batches a trial's rate is computed from.
MIN_ROUNDS = 3
#: Fewest steady batches a trial's rate is computed from.
MIN_STEADY_BATCHES = 6
#: Busy workers per CPU the search may try: past 1 it still pays when workers also wait, past 2 it only costs.
CPU_OVERSUBSCRIPTION = 2.0
#: Share of the free file descriptors the loader's workers may take.
FD_SHARE = 0.5
#: ``Trial.refused`` of a trial that got fewer than two batches: the time budget ran out first, or the
#: trial's slice of the dataset did (any other ``refused`` is the memory guard's reason).
BUDGET_REFUSAL = "the time budget ran out first"
DATASET_REFUSAL = "the dataset ran out before two batches"


@dataclass(frozen=True)
class Trial:
    """One measured (or refused) configuration.

    ``batches_per_sec`` is the steady rate (start-up and the first round of ready batches excluded);
    ``startup_s`` the time to the first batch (worker start-up: paid every epoch by non-persistent
    loaders); ``seconds`` the trial's whole wall time; ``worker_busy`` each worker's CPU busy share and
    ``worker_mb`` its own (unique) memory, both measured during the trial; ``measurements`` > 1 when it
    was measured again (an outlier against its neighbours, or a close call) and the rate is the mean.

    What the cost model predicts the next worker count from (all over the steady part of the trial):
    ``wait_share`` is the share of the main thread's time spent waiting in the loader's ``next()``
    (near 0: the training path, not the loader, is the limit); ``work_s`` and ``cpu_s`` a worker's wall
    and CPU time per batch in the dataset and collate (measured inside the worker, as
    :mod:`~lightning_dataperf.loader.probe` does); ``main_s`` the main thread's time per batch when
    it does not wait (the consumer and the hand-over: ``1 / main_s`` is the most the path can take);
    ``tree_cpu_s`` the CPU seconds per batch of the whole path, read from the OS: this process (every
    thread: the consumer, the pin thread, the hand-over) and the workers (dataset and collate, and also
    what ``cpu_s`` cannot see: pickling batches into their queues, the queue's feeder threads). The CPUs
    over it is the most batches/s they can make, whoever makes them. ``sharing``: the
    ``torch.multiprocessing`` sharing strategy the workers sent their batches with (``None``: the process's
    own; :class:`~lightning_dataperf.loader.sharing.ShareBy`).
    """

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    batches_per_sec: float = 0.0
    startup_s: float = 0.0
    batches: int = 0
    memory_mb: float = 0.0
    refused: str | None = None
    measurements: int = 1
    seconds: float = 0.0
    worker_busy: float | None = None
    worker_mb: float | None = None
    precision: float | None = None
    wait_share: float | None = None
    work_s: float | None = None
    cpu_s: float | None = None
    main_s: float | None = None
    tree_cpu_s: float | None = None
    rough: bool = False  # no steady round was counted (the budget or the dataset ran out): the burst's rate
    sharing: str | None = None

    @property
    def config(self) -> Config:
        return self.num_workers, self.prefetch_factor, self.pin_memory

    @property
    def judged(self) -> bool:
        """A rate to compare: not refused, and not rough (cut before one steady round: the start-up burst's)."""
        return self.refused is None and not self.rough

    @property
    def measured_as(self) -> tuple[Config, str | None]:
        """The settings and the way the workers sent: the same settings sent another way measure another path."""
        return self.config, self.sharing

    def relative_error(self, floor: float) -> float:
        """The rate's relative standard error, never below ``floor`` (unknown: ``floor``)."""
        return max(floor, self.precision if self.precision is not None else floor)

    def loader_capacity(self) -> float | None:
        """Batches/s the workers could deliver if never held back (``workers / work_s``); ``None`` unknown."""
        if not self.num_workers or not self.work_s:
            return None
        return self.num_workers / self.work_s

    @property
    def cost(self) -> tuple[int, float, bool]:
        """Cheaper first: fewer workers, less memory in flight, no pinning."""
        return self.num_workers, self.memory_mb, self.pin_memory


@dataclass(frozen=True)
class Limits:
    """The knobs of one search that are not about the data."""

    time_budget: float
    batch_budget: int
    noise: float
    memory_fraction: float
    max_epochs: int | None
    min_workers: int
    precision: float = 0.03
    trial_seconds: float | None = None  # cap per trial; default: a fifteenth of the budget, at least 1 s

    @property
    def trial_cap(self) -> float:
        return self.trial_seconds if self.trial_seconds is not None else max(1.0, self.time_budget / 15)


def steady_rate(arrivals: list[float], round_size: int, skip: int | None = None) -> tuple[float, float, int]:
    """Steady batches/s from batch arrival times, its relative standard error, and the batches it counts.

    ``arrivals[0]`` is the first batch (the end of start-up). The ``skip`` batches after it (default
    ``round_size - 1``; a trial passes ``workers x prefetch - 1``) are the ones the workers had queued
    while the others were still starting (a burst that says nothing about the steady rate); the rest is
    cut into rounds of ``round_size`` batches (workers deliver in rounds), whose durations give the
    standard error. Returns ``(0, inf, 0)`` when there is not one whole round yet.
    """
    round_size = max(1, round_size)
    skip = round_size - 1 if skip is None else max(0, skip)
    steady = arrivals[skip:]
    rounds = (len(steady) - 1) // round_size
    if rounds < 1 or rounds * round_size < 2:
        return 0.0, math.inf, 0
    ends = steady[::round_size][: rounds + 1]
    durations = [later - earlier for earlier, later in itertools.pairwise(ends)]
    total = ends[-1] - ends[0]
    if total <= 0:
        return 0.0, math.inf, 0
    rate = rounds * round_size / total
    if rounds < 2:
        return rate, math.inf, rounds * round_size
    error = statistics.stdev(durations) / statistics.fmean(durations) / math.sqrt(rounds)
    return rate, error, rounds * round_size


def made_rate(made_at: list[float], arrivals: list[float], skip: int, in_flight: int) -> float | None:
    """Batches/s the workers made over a trial's steady window, from when each batch's collate ended.

    ``arrivals[skip]`` starts the window; it ends at the arrival ``in_flight`` (``workers x prefetch``)
    batches before the last: a DataLoader sends a batch's indices only after the batch ``in_flight`` before it
    was consumed, so every batch made before that moment has been received, and counting the ``made_at``
    (``perf_counter``, the same clock in every process) inside the window misses none. Unlike the arrivals'
    rate it does not count batches made before the window: a deep queue full at its start is consumed
    faster than the workers can refill it. ``None`` without :data:`MIN_STEADY_BATCHES` made inside the window.
    """
    end = len(arrivals) - 1 - in_flight
    if end <= skip:
        return None
    start_at, end_at = arrivals[skip], arrivals[end]
    made = sum(1 for moment in made_at if start_at <= moment < end_at)
    if made < MIN_STEADY_BATCHES or end_at <= start_at:
        return None
    return made / (end_at - start_at)


def trial_rate(
    arrivals: list[float], made_at: list[float], workers: int, skip: int, in_flight: int
) -> tuple[float, float, bool]:
    """A trial's rate, its relative standard error and whether it is rough, from its batches' arrivals and the
    moments the workers made them: :func:`steady_rate`, no higher than :func:`made_rate` (the batches made
    inside the window). Rough where not one steady round arrived: the rate is then all the arrivals' (the
    start-up burst's), infinitely uncertain."""
    rate, error, counted = steady_rate(arrivals, workers, skip)
    rough = counted == 0 and len(arrivals) > 1
    if rough:
        rate = (len(arrivals) - 1) / max(arrivals[-1] - arrivals[0], 1e-9)
    elif (made := made_rate(made_at, arrivals, skip, in_flight)) is not None:
        # not the batches the workers had made before the window (a full deep queue)
        rate = min(rate, made)
    return rate, error, rough


def margin(first: Trial, second: Trial, noise: float) -> float:
    """Relative difference two trials' rates must exceed to count as different: ``noise``, or twice their
    combined standard error when that is larger (a noisy pair needs a bigger gap)."""
    return gap(first.relative_error(noise / 2), second.relative_error(noise / 2), noise)


def decided(rate: float, error: float, against: Trial | None, noise: float) -> bool:
    """Whether a trial measuring ``rate`` (relative standard error ``error``) so far is decided against ``against``.

    Decided: slower than ``against`` by more than :data:`DECIDED_GAP` plus :data:`DECIDED_SE` times the
    combined standard error, so no longer measurement would turn the loss into a tie. A trial that reads
    *faster* is never decided early: it may become the search's best, the reference of every later
    comparison, so it is measured to its precision (stopped early while it looked far ahead, its rate would
    also read high). ``False`` without a measured ``against`` or either error estimate.

    Example::

        decided(10.0, 0.1, Trial(4, 2, False, 40.0, batches=20, precision=0.05), 0.03)  # True: a quarter
    """
    if against is None or against.refused is not None or against.precision is None or against.batches_per_sec <= 0:
        return False
    return slower_for_sure(rate, error, against.batches_per_sec, against.relative_error(noise / 2))


def confirmation_candidates(trials: list[Trial], count: int = 3, band: float = CONFIRM_BAND) -> list[Trial]:
    """The ``count`` fastest trials, then the cheapest trial within ``band`` of the fastest if not among them."""
    ranked = sorted(trials, key=lambda trial: trial.batches_per_sec, reverse=True)
    chosen = ranked[:count]
    cheapest = cheapest_near(ranked, band)
    if cheapest is not None and cheapest not in chosen:
        chosen.append(cheapest)
    return chosen


def cheapest_near(trials: list[Trial], share: float) -> Trial | None:
    """The cheapest trial at least ``share`` times as fast as the fastest (``None`` without trials)."""
    if not trials:
        return None
    top = max(trial.batches_per_sec for trial in trials)
    return min((trial for trial in trials if trial.batches_per_sec >= share * top), key=lambda trial: trial.cost)


TrialListener = Callable[[str, Any], None]


def rated(trials: Iterable[Trial]) -> list[Trial]:
    """The trials that measured a rate (not refused, at least two batches, not rough).

    A rough trial was cut before one steady round: its rate is the burst of batches made during start-up,
    many times the steady rate, so it is neither ranked nor taken.
    """
    return [trial for trial in trials if trial.judged and trial.batches > 1]


def percent_change(trial: Trial, reference: Trial) -> str:
    """``trial``'s rate against ``reference``'s, e.g. ``"+27%"`` (``"n/a"`` without a reference rate)."""
    if not reference.batches_per_sec:
        return "n/a"
    return f"{100 * (trial.batches_per_sec / reference.batches_per_sec - 1):+.0f}%"
