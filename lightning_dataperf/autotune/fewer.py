"""Autotune's way down: fewer workers where they are as fast as more (docs/autotune.md, section 5)."""

from __future__ import annotations

import math

from lightning_dataperf.autotune.compare import Compare
from lightning_dataperf.autotune.model import fewer_capacity, main_thread_rate, path_bound, workers_needed
from lightning_dataperf.autotune.trial import TIE_BAND, Trial, percent_change

__all__ = ["MODEL_SLACK", "FewerWorkers"]

#: 0 workers are tried when the main thread alone is predicted within this share of the best rate (the
#: prediction counts the hand-over of batches from workers, which loading in the main thread does not pay).
MODEL_SLACK = 0.1


class FewerWorkers:
    """The probes down of one :class:`~lightning_dataperf.autotune.search.Search` (its trials, budget and stop).

    Example::

        search = Search(runner, fixed={}, pins=(True, False), limits=limits, cpus=16)
        best = search.climb_workers(start)          # calls search.fewer.predicted / below_start where they apply
        best = search.fewer.after_climb(best, start)
    """

    def __init__(self, compare: Compare) -> None:
        self.compare = compare

    def predicted(self, best: Trial) -> Trial:
        """A start the training path limits (its main thread hardly waited): the workers its rate needs, and
        0 where that is at most one, each kept while as fast."""
        compare = self.compare
        waited = f"the main thread waited for batches {100 * (best.wait_share or 0):.0f}% of the time"
        limit = f"the training path is the limit at {best.num_workers} workers ({waited}); more cannot help"
        compare.stop("path", limit)
        need = workers_needed(best, compare.limits.min_workers)
        tried = best
        for lower in dict.fromkeys(value for value in (need, 0 if need <= 1 else None) if value is not None):
            if lower >= tried.num_workers or lower < compare.limits.min_workers or compare.runner.remaining <= 0:
                continue
            trial = compare.measure(lower, best.prefetch_factor, best.pin_memory, against=best)
            if not compare.as_fast(trial, best):
                break
            tried = trial
        if tried is not best:
            compare.stop_detail += f"; {tried.num_workers} workers were as fast"
        return tried

    def below_start(self, start: Trial, best: Trial) -> Trial:
        """The first step up from ``start`` gained nothing: half its workers, and down while fewer are as fast
        (``best``, the climb's answer, where the first count down loses or cannot be as fast)."""
        compare = self.compare
        lower = self.halved(start.num_workers)
        if lower is None or compare.runner.remaining <= 0 or self.too_few(lower, start):
            return best
        trial = compare.measure(lower, start.prefetch_factor, start.pin_memory, against=start)
        if not compare.as_fast(trial, start):
            return best
        compare.stop_reason = ""
        return self._descend(trial, start)

    def halved(self, workers: int) -> int | None:
        """Half of ``workers``, not below the search's minimum (``None`` already there)."""
        minimum = self.compare.limits.min_workers
        if workers <= minimum:
            return None
        return max(minimum, workers // 2)

    def too_few(self, workers: int, best: Trial, stopping: bool = False) -> bool:
        """``workers`` cannot be as fast as ``best``: what a batch cost the measured workers in CPU says they
        could make at most less than the tie band allows (:func:`~lightning_dataperf.autotune.model.fewer_capacity`,
        the most of any trial: the optimistic bound). No trial is spent on it; ``stop_detail`` says it
        (``stopping``: the way down ends here, ``stop_reason`` ``"fewer"``)."""
        if not workers:
            return False
        compare = self.compare
        capacity = max((fewer_capacity(trial, workers) for trial in compare.measured()), default=math.inf)
        if capacity >= best.batches_per_sec * (1 - max(TIE_BAND, compare.limits.noise)):
            return False
        if stopping:
            compare.stop("fewer", f"fewer workers were as fast (down to {best.num_workers})")
        compare.stop_detail += f"; {workers} workers cannot be as fast (the CPU per batch allows {capacity:.1f}/s)"
        return True

    def _descend(self, best: Trial, above: Trial) -> Trial:
        compare = self.compare
        while (lower := self.halved(best.num_workers)) is not None and compare.runner.remaining > 0:
            if self.too_few(lower, best, stopping=True):
                return best
            trial = compare.measure(lower, best.prefetch_factor or above.prefetch_factor, best.pin_memory, against=best)
            if not compare.as_fast(trial, best):
                compare.stop(
                    "fewer", f"{lower} workers lost {percent_change(trial, best)}; {above.num_workers} gained nothing"
                )
                return best
            best = trial
        compare.stop("fewer", f"fewer workers were as fast (down to {best.num_workers}, {above.num_workers} no faster)")
        return best

    def after_climb(self, best: Trial, start: Trial) -> Trial:
        """After the climb, fewer workers than the start (and 0 when allowed) where they may be as fast.

        Tried when the cost model says the main thread or the path limits
        (:func:`~lightning_dataperf.autotune.model.main_thread_rate`:
        loading in the main thread would still reach the best rate; or the main thread hardly waited).
        Not after a climb whose first step up gained beyond noise: the rate was still rising at the start, and
        with diminishing returns per worker, fewer workers lose at least as much per worker as the step gained.
        A climb whose first step gained nothing already went down (:meth:`below_start`). Within noise is a tie,
        resolved towards fewer workers; a count that loses beyond noise ends the way down (0 workers, tried only
        where the model predicts it, is measured regardless: it has no hand-over to pay), and so does a count too
        few for the CPU a batch costs (:meth:`too_few`).
        """
        compare = self.compare
        if "num_workers" in compare.fixed:
            return best
        minimum = compare.limits.min_workers
        main_rate = main_thread_rate(best)
        zero = minimum == 0 and main_rate >= (1 - MODEL_SLACK) * best.batches_per_sec
        if not (zero or path_bound(best)):
            return best
        counts = []
        if path_bound(best):
            counts.append(workers_needed(best, max(1, minimum)))
            lower = start.num_workers
            while (lower := lower // 2) >= max(1, minimum):
                counts.append(lower)
        if zero:
            counts.append(0)
        why = "the main thread limits" if zero else "the training path limits"
        before, lost = best, False
        for workers in sorted({count for count in counts if count < start.num_workers}, reverse=True):
            if compare.runner.remaining <= 0 or (lost and workers) or self.too_few(workers, best):
                lost = lost or workers > 0
                continue
            prefetch = best.prefetch_factor or start.prefetch_factor
            trial = compare.measure(workers, prefetch, best.pin_memory, against=best)
            if compare.as_fast(trial, best):  # a tie goes to fewer workers
                best = trial
            else:
                lost = True
        if best is not before:
            compare.stop_detail += (
                f"; fewer were as fast ({why}): {best.num_workers} workers {percent_change(best, before)}"
            )
        return best
