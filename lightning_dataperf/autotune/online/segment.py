"""The step periods of the setting in use, since it was switched to: its steady rate and what trying it cost."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from lightning_dataperf.autotune.online.records import Measured, Setting
from lightning_dataperf.autotune.trial import steady_rate

__all__ = ["STALLS_RECUR", "STALL_RATIO", "Segment", "Stalls", "burst_of"]

#: A round of the workers' batches lasting more than this many times the look's median round is a stall.
STALL_RATIO = 4.0

#: Stalls the looks must have shown before the summary says what they took: a pattern, not a one-off.
STALLS_RECUR = 3


def burst_of(num_workers: int, prefetch_factor: int | None, epoch_batches: int | None = None) -> int:
    """Batches a new iterator's workers queue while the others start (one without workers: its first): not the
    steady rate, so a look leaves them out and must fit after them.

    At most a quarter of an epoch: each epoch skips its burst again, and 32 workers x 4 prefetched would skip
    all 125 batches of the H200 JPEG benchmark's epoch, a trial that never measures.
    """
    if not num_workers:
        return 1
    queued = num_workers * (prefetch_factor or 1)
    return queued if epoch_batches is None else max(1, min(queued, epoch_batches // 4))


class Segment:
    """The step periods of the setting in use, since it was switched to (a trial, or a drift watch's window)."""

    def __init__(self, setting: Setting, against: Measured | None, precision: float | None = None) -> None:
        self.setting, self.against = setting, against
        self.precision = precision
        """The error it runs to where a close call needs more than the loop's own (then not cut at ``max_batches``)."""
        self.skip = self.skipped = 0
        self.switch_s = 0.0
        self.periods: list[float] = []
        self.total = 0.0
        """``sum(periods)``, kept as they come: the per-step checks stay O(1) on a trial of thousands of steps."""
        self.next_look = 0
        """Periods at which the rate is read again (every eighth more: reading it is O(periods))."""
        self.fresh = True
        self.queued_in = 0
        """Batches already queued as each segment's counting began: made before it, not at its rate."""
        self.loads: list[float] = []
        """Seconds each batch took to load in this process (``num_workers=0``), where the feeder reports them."""

    def add(self, period: float) -> bool:
        """Counts ``period`` (or skips it); ``True`` where it is the first counted one of a segment."""
        if self.skip > 0:
            self.skip, self.skipped = self.skip - 1, self.skipped + 1
            self.switch_s += period
            return False
        self.periods.append(period)
        self.total += period
        first, self.fresh = self.fresh, False
        return first

    def rate(self) -> tuple[float, float, int]:
        """Its steady rate between its stalls (:meth:`stalls`), the relative standard error between them, and the
        batches counted (its stalls' included)."""
        return self._rate(*self._split())

    def _rate(self, steady: list[float], stalls: list[float]) -> tuple[float, float, int]:
        """:meth:`rate` from the look's rounds as :meth:`_split` gave them."""
        size = max(1, self.setting.num_workers)
        if len(steady) < 2:
            return self._steady_rate()
        mean = statistics.fmean(steady)
        return size / mean, statistics.stdev(steady) / mean / math.sqrt(len(steady)), (len(steady) + len(stalls)) * size

    def _steady_rate(self) -> tuple[float, float, int]:
        """Its steady rate over every round, stalls included (:func:`steady_rate`)."""
        arrivals = [0.0]
        for period in self.periods:
            arrivals.append(arrivals[-1] + period)
        return steady_rate(arrivals, max(1, self.setting.num_workers), skip=0)

    def _split(self) -> tuple[list[float], list[float]]:
        """The counted periods in rounds of ``num_workers`` (a round's batches arrive together): the steady rounds,
        and each stall's seconds beyond the median round (a round longer than :data:`STALL_RATIO` times it; none
        in a single round)."""
        size = max(1, self.setting.num_workers)
        rounds = [sum(self.periods[i : i + size]) for i in range(0, len(self.periods) - size + 1, size)]
        if len(rounds) < 2:
            return rounds, []
        median = statistics.median(rounds)
        steady = [length for length in rounds if length <= STALL_RATIO * median]
        return steady, [length - median for length in rounds if length > STALL_RATIO * median]

    def stalls(self) -> list[float]:
        """Each stall's seconds beyond the look's median round: a round longer than :data:`STALL_RATIO` times it."""
        return self._split()[1]

    def measured(self, queued_out: int = 0) -> Measured:
        """Its steady rate between its stalls (:meth:`rate`), no higher than the rate the batches were made at:
        those queued as counting began (the workers' backlog from a switch's stall, up to ``workers x prefetch``)
        less those queued at its end were made before it (on the H200, 32 JPEG workers read 56 steps/s in the loop
        and 25 alone)."""
        rounds, stalls = self._split()
        raw, _, counted = self._steady_rate()
        seconds = sum(self.periods[:counted]) if counted else self.total
        batches = counted or len(self.periods)
        made, total = len(self.periods) - max(0, self.queued_in - queued_out), self.total
        if total and made * seconds < batches * total:  # batches / seconds stays the rate: a pooled look keeps it
            batches, seconds = max(0, made), total
        steady, error, _ = self._rate(rounds, stalls)
        if steady and raw:
            seconds *= raw / steady  # its seconds less its stalls
        rate = batches / seconds if seconds else 0.0
        # the skipped burst counts as the switch's cost only beyond the steps it would have taken anyway
        stall = max(0.0, self.switch_s - (self.skipped * seconds / batches if batches else 0.0))
        measured = Measured(self.setting, rate, error, batches, seconds, stall)
        return replace(measured, cost_s=self.cost(stalled=sum(stalls)))

    def cost(self, stalled: float = 0.0) -> float:
        """Its steps' time beyond the setting it stands in for (``against``, the one in use, read between its
        stalls) and its switch, less ``stalled`` seconds (its own stalls' at a look's end; per step, where the cap
        is checked, they are left in)."""
        rate = self.against.steps_per_sec if self.against is not None else 0.0
        total = self.total - stalled
        slower = max(0.0, total - len(self.periods) / rate) if rate else 0.0
        return slower + (self.switch_s if self.against is not None else 0.0)


class Stalls:
    """The run's stalls (a full garbage collection, a periodic log), pooled over its looks: each look's rate is read
    between its own (:meth:`Segment.rate`), and what they cost the run is said (:meth:`words`).

    On the collate pipeline, 2 cores, the training process paused ~140 ms for a full collection every ~1.2 s (with
    workers every 2-3 s): a 1-s look held one or none and read ±15% or ±0%, a stall-free look 10-15% above one
    that held one, and the search set such looks against each other (the start kept in 1 run of 10).
    """

    def __init__(self) -> None:
        self.count, self.excess, self.seconds = 0, 0.0, 0.0

    def add(self, look: Segment) -> None:
        """A look's stalls and seconds."""
        stalls = look.stalls()
        self.count += len(stalls)
        self.excess += sum(stalls)
        self.seconds += look.total

    def words(self) -> str:
        """What the stalls took, where they recur (:data:`STALLS_RECUR`) and took 1% of the looks' time or more."""
        share = self.excess / self.seconds if self.seconds else 0.0
        if self.count < STALLS_RECUR or share < 0.01:
            return ""
        return (
            f"rates read between the training process's stalls ({self.count} in {self.seconds:.0f} s of looks, each"
            f" over {STALL_RATIO:g}x the look's median round, {share:.0%} of the time: a full garbage collection, a"
            f" periodic log): the settings compared alike, the run's own steps/s about that much lower"
        )
