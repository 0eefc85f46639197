"""Autotune's way down: fewer workers where they are as fast as more.

:class:`FewerWorkers` holds the probes a :class:`~lightning_dataperf.autotune_search.Search` makes below its
start: where the training path limits the start (:meth:`FewerWorkers.predicted`: the workers the cost model
says its rate needs), where the first step up gained nothing (:meth:`FewerWorkers.below_start`: halving while
fewer are as fast), and after the climb where the main thread or the path limits
(:meth:`FewerWorkers.after_climb`). No trial is spent on a count too few for the CPU a batch costs
(:meth:`FewerWorkers.too_few`). Ties go to fewer workers.

Example::

    search = Search(runner, fixed={}, pins=(True, False), limits=limits, cpus=16)
    best = search.climb_workers(start)          # calls search.fewer.predicted / below_start where they apply
    best = search.fewer.after_climb(best, start)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lightning_dataperf.autotune_model import fewer_capacity, main_thread_rate, path_bound, workers_needed
from lightning_dataperf.autotune_records import TIE_BAND, Trial, percent_change

if TYPE_CHECKING:
    from lightning_dataperf.autotune_search import Search

__all__ = ["MODEL_SLACK", "FewerWorkers"]

#: 0 workers are tried when the main thread alone is predicted within this share of the best rate (the
#: prediction counts the hand-over of batches from workers, which loading in the main thread does not pay).
MODEL_SLACK = 0.1


class FewerWorkers:
    """The probes down of one :class:`~lightning_dataperf.autotune_search.Search` (its trials, budget and stop)."""

    def __init__(self, search: Search) -> None:
        self.search = search

    def predicted(self, best: Trial) -> Trial:
        """A start the training path limits (its main thread hardly waited): the workers its rate needs, and
        0 where that is at most one, each kept while as fast."""
        search = self.search
        waited = f"the main thread waited for batches {100 * (best.wait_share or 0):.0f}% of the time"
        limit = f"the training path is the limit at {best.num_workers} workers ({waited}); more cannot help"
        search.stop("path", limit)
        need = workers_needed(best, search.limits.min_workers)
        tried = best
        for lower in dict.fromkeys(value for value in (need, 0 if need <= 1 else None) if value is not None):
            if lower >= tried.num_workers or lower < search.limits.min_workers or search.runner.remaining <= 0:
                continue
            trial = search.measure(lower, best.prefetch_factor, best.pin_memory, against=best)
            if not search.as_fast(trial, best):
                break
            tried = trial
        if tried is not best:
            search.stop_detail += f"; {tried.num_workers} workers were as fast"
        return tried

    def below_start(self, start: Trial, best: Trial) -> Trial:
        """The first step up from ``start`` gained nothing: half its workers, and down while fewer are as fast
        (``best``, the climb's answer, where the first count down loses or cannot be as fast)."""
        search = self.search
        lower = self.halved(start.num_workers)
        if lower is None or search.runner.remaining <= 0 or self.too_few(lower, start):
            return best
        trial = search.measure(lower, start.prefetch_factor, start.pin_memory, against=start)
        if not search.as_fast(trial, start):
            return best
        search.stop_reason = ""
        return self._descend(trial, start)

    def halved(self, workers: int) -> int | None:
        """Half of ``workers``, not below the search's minimum (``None`` already there)."""
        minimum = self.search.limits.min_workers
        if workers <= minimum:
            return None
        return max(minimum, workers // 2)

    def too_few(self, workers: int, best: Trial, stopping: bool = False) -> bool:
        """``workers`` cannot be as fast as ``best``: what a batch cost the measured workers in CPU says they
        could make at most less than the tie band allows (:func:`~lightning_dataperf.autotune_model.fewer_capacity`,
        the most of any trial: the optimistic bound). No trial is spent on it; ``stop_detail`` says it
        (``stopping``: the way down ends here, ``stop_reason`` ``"fewer"``)."""
        if not workers:
            return False
        search = self.search
        capacity = max((fewer_capacity(trial, workers) for trial in search.measured()), default=math.inf)
        if capacity >= best.batches_per_sec * (1 - max(TIE_BAND, search.limits.noise)):
            return False
        if stopping:
            search.stop("fewer", f"fewer workers were as fast (down to {best.num_workers})")
        search.stop_detail += f"; {workers} workers cannot be as fast (the CPU per batch allows {capacity:.1f}/s)"
        return True

    def _descend(self, best: Trial, above: Trial) -> Trial:
        search = self.search
        while (lower := self.halved(best.num_workers)) is not None and search.runner.remaining > 0:
            if self.too_few(lower, best, stopping=True):
                return best
            trial = search.measure(lower, best.prefetch_factor or above.prefetch_factor, best.pin_memory, against=best)
            if not search.as_fast(trial, best):
                search.stop(
                    "fewer", f"{lower} workers lost {percent_change(trial, best)}; {above.num_workers} gained nothing"
                )
                return best
            best = trial
        search.stop("fewer", f"fewer workers were as fast (down to {best.num_workers}, {above.num_workers} no faster)")
        return best

    def after_climb(self, best: Trial, start: Trial) -> Trial:
        """After the climb, fewer workers than the start (and 0 when allowed) where they may be as fast.

        Tried when the cost model says the main thread or the path limits
        (:func:`~lightning_dataperf.autotune_model.main_thread_rate`:
        loading in the main thread would still reach the best rate; or the main thread hardly waited).
        Not after a climb whose first step up gained beyond noise: the rate was still rising at the start, and
        with diminishing returns per worker, fewer workers lose at least as much per worker as the step gained
        (measured on the H200 side-stream row: 15 -> 18 workers gained 5%, and the probe of 7 that an earlier
        rule made there read 17 batches/s against 36). A climb whose first step gained nothing already went down
        (:meth:`below_start`). Within noise is a tie, resolved towards fewer workers; a count that loses beyond
        noise ends the way down (0 workers, tried only where the model predicts it, is measured regardless: it
        has no hand-over to pay), and so does a count too few for the CPU a batch costs (:meth:`too_few`).
        """
        search = self.search
        if "num_workers" in search.fixed:
            return best
        minimum = search.limits.min_workers
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
            if search.runner.remaining <= 0 or (lost and workers) or self.too_few(workers, best):
                lost = lost or workers > 0
                continue
            prefetch = best.prefetch_factor or start.prefetch_factor
            trial = search.measure(workers, prefetch, best.pin_memory, against=best)
            if search.as_fast(trial, best):  # a tie goes to fewer workers
                best = trial
            else:
                lost = True
        if best is not before:
            search.stop_detail += (
                f"; fewer were as fast ({why}): {best.num_workers} workers {percent_change(best, before)}"
            )
        return best
