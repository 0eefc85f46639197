"""Compare: one search's trials put to :mod:`~lightning_dataperf.autotune.noise`'s comparisons, and its stop record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_dataperf.autotune import noise
from lightning_dataperf.autotune.runner import TrialRunner
from lightning_dataperf.autotune.trial import TIE_BAND, Config, Limits, Trial, margin, rated

__all__ = ["Compare"]


class Compare:
    """One search's trials, compared beyond noise, and why it stopped (``stop_reason``, ``stop_detail``).

    Example::

        compare = Compare(runner, fixed={}, limits=limits)
        if compare.faster(compare.measure(4, 2, True), best):
            ...
    """

    def __init__(self, runner: TrialRunner, fixed: Mapping[str, Any], limits: Limits) -> None:
        self.runner, self.fixed, self.limits = runner, fixed, limits
        self.stop_reason, self.stop_detail = "", ""

    def config(self, workers: int, prefetch: int | None, pin: bool) -> Config:
        workers = self.fixed.get("num_workers", workers)
        prefetch = self.fixed.get("prefetch_factor", prefetch or 2) if workers else None
        return workers, prefetch, self.fixed.get("pin_memory", pin)

    def measure(self, workers: int, prefetch: int | None, pin: bool, against: Trial | None = None) -> Trial:
        """One trial; compared with ``against`` it stops once decided (its precision is not needed then)."""
        return self.runner.measure(*self.config(workers, prefetch, pin), against=against)

    def faster(self, trial: Trial, than: Trial) -> bool:
        """Faster by more than noise: ``noise``, or twice the two rates' combined standard error."""
        gap = margin(trial, than, self.limits.noise)
        return trial.judged and noise.faster(trial.batches_per_sec, than.batches_per_sec, gap)

    def as_fast(self, trial: Trial, than: Trial) -> bool:
        """Not slower by more than noise (either is fine), and never more than :data:`TIE_BAND` slower."""
        gap = min(margin(trial, than, self.limits.noise), max(TIE_BAND, self.limits.noise))
        return trial.judged and noise.as_fast(trial.batches_per_sec, than.batches_per_sec, gap)

    def ahead(self, trial: Trial, than: Trial) -> bool:
        """Faster by more than ``noise`` alone (what a repeated trial must still read to be followed)."""
        return noise.ahead(trial.batches_per_sec, than.batches_per_sec, self.limits.noise)

    def faster_but_unsure(self, trial: Trial, than: Trial) -> bool:
        """Faster by more than ``noise``, measured once, budget left: where :meth:`faster` said no, worth a
        repeat (not beyond the two rates' combined error)."""
        raw = self.ahead(trial, than)
        return raw and trial.refused is None and trial.measurements == 1 and self.runner.remaining > 0

    def confirmed(self, trial: Trial, best: Trial, race: bool = False) -> tuple[Trial, bool]:
        """``trial`` (measured again where it was unsure) and whether it is faster than ``best``: beyond noise
        at once, or faster by ``noise`` alone but not beyond its own error, then still so once measured again
        with the same workers (alive still: no start-up). Still ahead but by less than ``noise`` then, ``best``
        (measured once) is measured again too, and the two means decide. A repeat that measured nothing (the
        budget ran out, or it was cut before one steady round: :meth:`TrialRunner.remeasure` returns the trial
        itself) confirms nothing.

        ``race``: also where ``trial`` read within noise *below* ``best`` (each measured once), both are measured
        again and the means decide (the hand-over's trial where the workers were mostly idle: see
        :meth:`~lightning_dataperf.autotune.handover.Handover.attempt`).
        """
        best = self.runner.latest(best)  # measured again since the caller read it, perhaps (by this method)
        if self.faster(trial, best):
            return trial, True
        tied = race and trial.measurements == 1 and self.as_fast(trial, best) and self.runner.remaining > 0
        if not (self.faster_but_unsure(trial, best) or tied):
            return trial, False
        again = self.runner.remeasure(trial, against=best)
        if again is trial or self.ahead(again, best):
            return again, again is not trial
        leading = again.batches_per_sec > best.batches_per_sec or (race and self.as_fast(again, best))
        if best.measurements == 1 and leading and self.runner.remaining > 0:
            # still ahead, within noise: ``best``'s one look may have read high; measured again too, the means decide
            reference = self.runner.remeasure(best)
            return again, reference is not best and self.ahead(again, reference)
        return again, False

    def stop(self, reason: str, detail: str) -> None:
        if not self.stop_reason:
            self.stop_reason, self.stop_detail = reason, detail

    def measured(self) -> list[Trial]:
        """The trials measured the current way that have a rate."""
        return rated(self.runner.trials.values())
