"""Autotune's decisions: the worker climb, prefetch and pinning, noise-aware comparisons (docs/autotune.md, 3-6)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from lightning_dataperf.autotune.bounds import bounds_text, tightest
from lightning_dataperf.autotune.compare import Compare
from lightning_dataperf.autotune.fewer import MODEL_SLACK, FewerWorkers
from lightning_dataperf.autotune.handover import Handover, gain_beyond_reach
from lightning_dataperf.autotune.model import (
    cpu_ceiling,
    handover_bound,
    next_workers,
    path_bound,
    queue_starved,
    smallest_step,
)
from lightning_dataperf.autotune.runner import TrialRunner
from lightning_dataperf.autotune.trial import (
    BUDGET_REFUSAL,
    DATASET_REFUSAL,
    OUTLIER_SHARE,
    TIE_BAND,
    Limits,
    Trial,
    percent_change,
)

__all__ = ["MODEL_SLACK", "TIE_BAND", "Search"]


#: Most doublings of ``prefetch_factor`` tried.
MAX_PREFETCH = 16


class Search:
    """One search's decisions over a :class:`TrialRunner`.

    Example::

        search = Search(runner, fixed={}, pins=(True, False), limits=limits, cpus=16)
        best = search.climb_workers(runner.measure(15, 2, True))
        best = search.tune_prefetch(best)
    """

    def __init__(
        self,
        runner: TrialRunner,
        fixed: Mapping[str, Any],
        pins: tuple[bool, ...],
        limits: Limits,
        cpus: int = 1,
        handover_reserve: float = 0.0,
    ) -> None:
        self.runner, self.fixed, self.pins, self.limits, self.cpus = runner, fixed, pins, limits, cpus
        self.compare = Compare(runner, fixed, limits)
        # the step up that stopped the climb for lack of gain, and the words the stop said of it
        self.gained_nothing: tuple[Trial, str] | None = None
        self.handover = Handover(handover_reserve)  # the one trial of another hand-over, its budget, its result
        self.fewer = FewerWorkers(self.compare)  # the probes down

    def _cpus_spent(self, best: Trial) -> float | None:
        """The CPU ceiling when ``best`` reached it within noise, else ``None``.

        Measured from the OS (``tree_cpu_s``), the ceiling needs two worker counts at ``best``'s prefetch
        and pinning (one point cannot say how a batch's CPU changes with the worker count), and takes the
        cheapest CPU per batch at ``best``'s count or above: a batch need not cost the same CPU at every worker
        count, and only that says what more workers would pay. Without the OS figure: the in-loader model of
        :func:`~lightning_dataperf.autotune.model.cpu_ceiling`, from one point.
        """
        if best.tree_cpu_s is None:
            ceiling = cpu_ceiling(best, self.cpus)
        else:
            others = [
                trial
                for trial in self.compare.measured()
                if trial.tree_cpu_s and trial.num_workers and trial.num_workers != best.num_workers
                and (trial.prefetch_factor, trial.pin_memory) == (best.prefetch_factor, best.pin_memory)
            ]  # fmt: skip
            if not others:
                return None
            above = [trial.tree_cpu_s for trial in others if trial.num_workers > best.num_workers]
            ceiling = cpu_ceiling(dataclasses.replace(best, tree_cpu_s=min([best.tree_cpu_s, *above])), self.cpus)
        return ceiling if ceiling <= best.batches_per_sec * (1 + self.limits.noise) else None

    def stop_against(self, chosen: Trial) -> None:
        """Where the climb stopped for lack of gain but the answer is another, fewer-worker setting (the choice's
        close call, a probe down), the stop's figure is set against the answer, not the best at the stop: a
        newcomer read "measured 8 workers; more gave nothing (12 workers: +25%)", the +25% against 4 workers."""
        if self.compare.stop_reason != "gain" or self.gained_nothing is None:
            return
        more, said = self.gained_nothing
        if chosen.num_workers < more.num_workers and self.compare.stop_detail.startswith(
            said
        ):  # not another stop's words
            self.compare.stop_detail = self.compare.stop_detail.replace(
                said, _gained_nothing(self.runner.latest(more), chosen), 1
            )

    # ------------------------------------------------------------------ workers
    def climb_workers(self, best: Trial) -> Trial:
        """Up while the gain holds; if neither the first step up nor a count between gains, down while fewer
        are as fast.

        A start the training path already limits (its main thread hardly waited for batches) does not
        climb: more workers cannot feed it faster. The cost model says how many workers that rate needs,
        and one trial there tells whether the cheaper setting is as fast. The hand-over's trial
        (:class:`~lightning_dataperf.autotune.handover.Handover`) is made mid-climb where it binds, or
        where the climb stopped; adopted after a stop for lack of gain, the climb goes on from it.
        """
        if "num_workers" in self.fixed:
            self.compare.stop("fixed", f"num_workers={best.num_workers} is yours")
            return best
        if path_bound(best):
            return self.fewer.predicted(best)
        start = best
        with self.runner.reserved(self.handover.reserve):
            best = self._ascend(best)
        faster = self.handover.attempt(self.compare, best)
        best = self.runner.latest(best)  # the hand-over's race may have measured it again
        if faster is not None:
            if self.compare.stop_reason != "gain":  # a bound or the CPUs stopped the climb: it cannot go on
                return faster
            self.compare.stop_reason = self.compare.stop_detail = ""  # the hand-over limited the gain: climb on from it
            return self._ascend(faster)
        if best.config != start.config or self.compare.stop_reason != "gain":
            return best
        return self.fewer.below_start(best, best)  # ``start`` as last measured (a confirmation may have re-measured it)

    def _ascend(self, best: Trial) -> Trial:
        """Up while the gain holds. A step that gains nothing over ``best`` brackets the peak where a count
        between them is worth a trial (:meth:`_middle`): faster there, the bracket above it is halved again."""
        runner, cpus = self.runner, self.cpus
        while True:
            bounds = runner.worker_bounds(best.prefetch_factor, best.pin_memory)
            name, limit = tightest(bounds)
            if best.num_workers >= limit:  # above it: the bound was read from ``best``'s own trial, after it
                after = f"; {best.num_workers} were measured before it" if best.num_workers > limit else ""
                self.compare.stop(name, f"stopped at the {name} bound: {limit} workers ({bounds_text(bounds)}){after}")
                return best
            if runner.remaining <= 0:
                held = " (the rest is kept to re-measure a close call and for the hand-over's trial)"
                self.compare.stop(
                    "time budget", f"the time budget ran out at {best.num_workers} workers, still gaining{held}"
                )
                return best
            if best.num_workers and path_bound(best):
                self.compare.stop(
                    "path", f"the training path is the limit at {best.num_workers} workers; more cannot help"
                )
                return best
            if best.num_workers and (ceiling := self._cpus_spent(best)) is not None:
                detail = f"the cost model: at most {ceiling:.1f} batches/s, measured {best.batches_per_sec:.1f}"
                self.compare.stop(
                    "CPUs", f"the CPUs are the limit at {best.num_workers} workers ({detail}); more cannot help"
                )
                return best
            step = next_workers(best, int(min(limit, 1 << 20)), cpus)
            if best.num_workers and step == limit and step < smallest_step(best.num_workers):
                # the bound leaves less than one step: a trial could not tell a gain of a few workers from noise
                self.compare.stop(name, f"stopped at the {name} bound: {limit} workers ({bounds_text(bounds)}), "
                          f"less than one step above {best.num_workers}")  # fmt: skip
                return best
            trial = self.compare.measure(step, best.prefetch_factor, best.pin_memory, against=best)
            if trial.refused is not None:
                names = {BUDGET_REFUSAL: "time budget", DATASET_REFUSAL: "dataset"}
                self.compare.stop(names.get(trial.refused, "memory guard"), f"{step} workers refused: {trial.refused}")
                return best
            trial, faster = self.compare.confirmed(trial, best)  # unsure (cut short by the trial cap): measured again
            if faster:
                best = trial
                if handover_bound(best) and not self.handover.tried:  # adopted: the climb goes on from it
                    best = self.handover.attempt(self.compare, best, stopped=False) or runner.latest(best)
                continue
            best = runner.latest(best)  # the confirmation may have measured it again
            if runner.remaining <= 0:  # the trial was cut short: it proves nothing
                self.compare.stop("time budget", f"the time budget ran out measuring {step} workers")
                return best
            if trial.rough:  # the dataset ran out before one steady round: the burst's rate proves nothing
                limit, more = runner.last_cut or ("", "")  # the limit that cut it: the dataset, or the budget
                cut = f": {limit}" + (f"; {more}" if more else "") if limit else ""
                self.compare.stop("cut short", f"{step} workers were cut before one steady round (not ranked){cut}")
                return best
            if trial.batches_per_sec < OUTLIER_SHARE * best.batches_per_sec and trial.measurements == 1:
                # far slower: an artefact (start-up, memory) until seen twice; a smaller loss is taken as measured
                trial = runner.remeasure(trial, against=best)
                if self.compare.faster(trial, best):
                    best = trial
                    continue
            while (middle := self._middle(best, trial)) is not None:
                best = middle  # the peak lies below ``step``: halve the bracket again above the new best
            best = runner.latest(best)
            said = _gained_nothing(trial, best)
            self.compare.stop("gain", said)
            self.gained_nothing = trial, said
            return best

    def _middle(self, best: Trial, more: Trial) -> Trial | None:
        """The count halfway between ``best`` and ``more`` (which gained nothing over it), measured where worth a
        trial; the trial if faster than ``best`` (:meth:`confirmed`), else ``None``.

        Worth it where ``more`` lost beyond noise and is at least a step above ``best``
        (:func:`~lightning_dataperf.autotune.model.smallest_step`, 20%: the rate fell somewhere between), or
        tied but the middle is itself a step: past a rising rate, two equal readings bracket the peak. A bracket
        narrower than a step is not halved: its middle is within 10% of a measured count, and a trial cannot
        tell their rates apart.

        Not past what the climb itself would not pass: a bound (from every trial so far, ``more``'s included),
        a ``best`` the training path or the CPUs already limit. A middle cut short (refused, or rough: no
        steady round) proves nothing; one the budget left no time for makes the stop ``"time budget"``.
        """
        middle = (best.num_workers + more.num_workers) // 2
        lost = not self.compare.as_fast(more, best) and more.num_workers >= smallest_step(best.num_workers)
        if not (lost or middle >= smallest_step(best.num_workers)) or middle <= best.num_workers:
            return None
        _, limit = tightest(self.runner.worker_bounds(best.prefetch_factor, best.pin_memory))
        if middle > limit or path_bound(best) or self._cpus_spent(best) is not None:
            return None
        trial = (
            self.compare.measure(middle, best.prefetch_factor, best.pin_memory, best)
            if self.runner.remaining > 0
            else None
        )
        if trial is None or not trial.judged:
            if self.runner.remaining <= 0:  # the peak lies inside the bracket, unmeasured: say so, not "gain"
                between = f"{best.num_workers} (best) and {more.num_workers} ({percent_change(more, best)})"
                self.compare.stop("time budget", f"the time budget ran out before {middle} workers, between {between}")
            return None
        trial, faster = self.compare.confirmed(trial, best)
        return trial if faster else None

    # ------------------------------------------------------------------ prefetch and pinning
    def tune_prefetch(self, best: Trial) -> Trial:
        """Deeper queues while they gain, where the workers could make more than they delivered; not where
        the CPUs are spent (a deeper queue holds more batches, it cannot make them faster), nor where the
        main thread's wait cannot hold a gain beyond noise
        (:func:`~lightning_dataperf.autotune.handover.gain_beyond_reach`)."""
        if "prefetch_factor" in self.fixed or not best.num_workers or not queue_starved(best, self.limits.noise):
            return best
        if gain_beyond_reach(best, self.limits.noise):
            return best
        if self._cpus_spent(best) is not None:
            return best
        while (best.prefetch_factor or 2) * 2 <= MAX_PREFETCH and self.runner.remaining > 0:
            trial = self.compare.measure(
                best.num_workers, (best.prefetch_factor or 2) * 2, best.pin_memory, against=best
            )
            if not self.compare.faster(trial, best):
                break
            best = trial
        return best

    def tune_pin(self, best: Trial) -> Trial:
        if "pin_memory" in self.fixed or len(self.pins) < 2 or self.runner.remaining <= 0:
            return best
        trial = self.compare.measure(best.num_workers, best.prefetch_factor, not best.pin_memory, against=best)
        return trial if self.compare.faster(trial, best) else best

    # ------------------------------------------------------------------ downwards
    def probe_fewer(self, best: Trial, start: Trial) -> Trial:
        """After the climb, fewer workers than ``start`` where the model says they may be as fast
        (:meth:`~lightning_dataperf.autotune.fewer.FewerWorkers.after_climb`)."""
        return self.fewer.after_climb(best, start)


def _gained_nothing(more: Trial, against: Trial) -> str:
    """The climb's stop for lack of gain, in words: ``"more gave nothing (12 workers: -8%)"``."""
    return f"more gave nothing ({more.num_workers} workers: {percent_change(more, against)})"
