"""The online loop's rules, free of Lightning: fed step periods, it says which loader setting to apply next."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import replace

from lightning_dataperf.autotune.noise import slower_for_sure
from lightning_dataperf.autotune.online.records import (
    MIN_TRUSTED_BATCHES,
    Measured,
    OnlineResult,
    Setting,
    SettingSpace,
)
from lightning_dataperf.autotune.online.search import CLOSE_CALL_FINEST, NeighbourSearch, Phase
from lightning_dataperf.autotune.online.segment import Segment, Stalls, burst_of
from lightning_dataperf.loader.policy import first_workers

__all__ = ["DRIFT", "ENDED", "FIRST_MOVES", "RAN_OUT", "SLOWER_TRIAL", "OnlineLoop", "planned_batches", "refusal"]

#: After the search, a window of steps whose rate moved this far from the kept setting's (and beyond three
#: standard errors), twice in a row, is drift: the loop looks again from the kept setting, within its cost cap.
DRIFT = 0.15

#: The run is long enough to decide when the cost cap holds one trial of its shortest trusted length at this much
#: slower than the setting in use (20%: past the 10% tie band, where a slower trial is cut).
SLOWER_TRIAL = 0.2

#: The start's measured facts (load and compute per batch) choose this many first moves.
FIRST_MOVES = 2

#: Why a search ended undecided: its next look would outlast the planned run, or the fit ended mid-look.
RAN_OUT = "the planned run ends before another look could be decided: the best measured beyond noise kept"
ENDED = "the fit ended before the search did: the best measured beyond noise kept"


class OnlineLoop:
    """Every rule of the online loop: a trial's length, when it is decided or cut, the cost cap, the drift watch,
    and (through :class:`~lightning_dataperf.autotune.online.search.NeighbourSearch`) which setting comes next.

    Fed the moment each training step starts (:meth:`step`), it returns the setting to switch to, or ``None``;
    :attr:`phase` names where it stands, :attr:`result` what it measured and kept.

    Args:
        start: the setting in use when the loop begins (measured first, with no switch).
        space: the settings it may try.
        precision: a trial is decided once its rate's relative standard error is this low.
        max_batches: a trial's steps at most (once it lasted ``min_seconds``).
        max_cost: the most the trials may cost, as a share of the planned run at the incumbent's rate.
        min_seconds: a trial's shortest length.
        max_seconds: a trial's longest length.
        planned: the run's planned training steps (``None``: unknown, no cost cap); read when the cap is.
        taken: the planned steps already taken (a resumed fit's included); default: the steps it was fed.

    Example::

        loop = OnlineLoop(Setting(1, 2, False, 2), space, planned=lambda: 1000.0)
        setting = loop.step(time.perf_counter(), mark=(epoch, validation_batches))
        if setting is not None:
            ...  # apply it to the loader, then loop.switched(stall_s) and loop.restart(burst)
    """

    def __init__(
        self,
        start: Setting,
        space: SettingSpace,
        precision: float = 0.03,
        max_batches: int = 200,
        max_cost: float = 0.05,
        min_seconds: float = 1.0,
        max_seconds: float = 10.0,
        planned: Callable[[], float | None] = lambda: None,
        taken: Callable[[], float] | None = None,
    ) -> None:
        self.space, self.planned = space, planned
        self.taken = taken or (lambda: self.steps)
        # 3%, the search's noise floor: two trials measured to it must then differ by 8.5% (twice their combined error)
        self.precision, self.max_batches = precision, max_batches
        # a share of the run, not seconds: a short run must not spend its length trying settings
        self.max_cost = max_cost
        # a trial shorter than this reads the machine's moment (other processes, the scheduler), not the setting
        self.min_seconds, self.max_seconds = min_seconds, max_seconds
        self.result = OnlineResult()
        self.search = NeighbourSearch(start, space)
        self.trial: Segment | None = Segment(start, None)
        self.watch: Segment | None = None
        self.stalls = Stalls()
        """The stalls the looks were read between, said in the summary."""
        self._stalls_said = ""
        self.queued: Callable[[], int] = lambda: 0
        """Batches the loader's workers made that training has not taken yet (set by whoever feeds the loop)."""
        self.epoch_batches: int | None = None
        """Batches an epoch of the loader holds, where known (set by whoever feeds the loop): caps a switch's burst."""
        self._last: tuple[float, Hashable] | None = None
        self._incumbent: Measured | None = None
        self._drifts = 0
        self.steps = 0
        """Training steps fed so far: of the planned run, those already taken (a look must fit in the rest)."""

    @property
    def phase(self) -> Phase:
        """The search's phase while it runs; then :attr:`Phase.WATCHING` (budget left) or :attr:`Phase.DONE`."""
        if self.trial is not None:
            return self.search.phase
        return Phase.WATCHING if self.watch is not None else Phase.DONE

    def restart(self, burst: int) -> None:
        """A new iterator (an epoch's, or a switch's): the next ``burst`` periods are its start-up."""
        self._last = None
        for segment in (self.trial, self.watch):
            if segment is not None:
                segment.skip, segment.fresh = max(segment.skip, burst), True

    def step(self, now: float, mark: Hashable = None) -> Setting | None:
        """A training step starts at ``now``: records the period that ended; the setting to switch to, or ``None``.

        ``mark``: what changes when something other than a training step ran in between (the epoch, validation
        batches seen); a period across a change of mark is not counted.
        """
        trial = self.trial
        if trial is None and self.watch is None:
            return None
        self.steps += 1
        last, self._last = self._last, (now, mark)
        if last is None or last[1] != mark:
            return None
        if trial is None:
            self._watching(now - last[0])
            return None
        if trial.add(now - last[0]):
            trial.queued_in += self.queued()
        if self._full(trial) or self._spent(trial) or self._decided(trial) or self._short_start(trial):
            self.stalls.add(trial)
            return self._next(trial.measured(self.queued()))
        return None

    def fetched(self, seconds: float) -> None:
        """A batch took ``seconds`` to load in the training process (``num_workers=0``): read for the first moves."""
        if self.trial is not None and self.trial.against is None and self.search.phase is Phase.START:
            self.trial.loads.append(seconds)

    def switched(self, switch_s: float) -> None:
        """The switch to the setting :meth:`step` returned stalled training ``switch_s`` seconds: the trial's cost."""
        if self.trial is not None:
            self.trial.switch_s += switch_s

    def _decided(self, trial: Segment) -> bool:
        """Its rate known to ``precision``, or so far behind the setting in use that no longer trial makes a tie."""
        if len(trial.periods) < trial.next_look:
            return False
        trial.next_look = len(trial.periods) + max(1, len(trial.periods) // 8)
        rate, error, counted = trial.rate()
        # three rounds of the workers at least: one round's batches arrive together, not at the steady rate
        precision = self._precision(trial.precision)
        enough = counted >= max(MIN_TRUSTED_BATCHES, 3 * max(1, trial.setting.num_workers)) and error <= precision
        enough = enough and trial.total >= self.min_seconds
        cut = trial.against is not None and counted >= 8 and trial.total >= self.min_seconds / 2
        against = trial.against
        return enough or (cut and against is not None and slower_for_sure(rate, error, *_rate_of(against)))

    def _precision(self, asked: float | None) -> float:
        """The error a look runs to: the loop's own, or finer where a close call asks (never finer than
        :data:`CLOSE_CALL_FINEST` of it)."""
        return self.precision if asked is None else min(self.precision, max(asked, CLOSE_CALL_FINEST * self.precision))

    def _fits(self, setting: Setting, asked: float | None, current: Setting) -> bool:
        """A look at ``setting`` can be decided before the planned run ends (a run of unknown length: it can)."""
        planned, incumbent = self.planned(), self._incumbent
        if planned is None or incumbent is None or not incumbent.steps_per_sec:
            return True
        # its rate and per-batch spread as last read, else the incumbent's
        seen = next((t for t in reversed(self.result.trials) if t.setting == setting and t.trusted), incumbent)
        rate, spread = seen.steps_per_sec or incumbent.steps_per_sec, seen.error * math.sqrt(seen.batches)
        shortest = max(MIN_TRUSTED_BATCHES, 3 * max(1, setting.num_workers), self.min_seconds * rate)
        needed = max(shortest, (spread / self._precision(asked)) ** 2)
        # a close call's look has no cap on steps; any other ends at max_batches once it is trusted
        most = self.max_seconds * rate
        most = most if asked is not None else min(most, max(shortest, self.max_batches))
        burst = burst_of(setting.num_workers, setting.prefetch_factor, self.epoch_batches) if setting != current else 0
        return self.taken() + burst + min(needed, most) <= planned

    def _full(self, segment: Segment) -> bool:
        """At its cap: ``max_batches`` steps (a close call's look: no cap on steps), but not under ``min_seconds``
        (200 steps of tiny batches took 0.17 s on 2 cores: a trial that short reads the machine's moment), or
        ``max_seconds``."""
        seconds, most = segment.total, self.max_batches if segment.precision is None else math.inf
        return seconds >= self.max_seconds or (len(segment.periods) >= most and seconds >= self.min_seconds)

    def _budget_s(self) -> float | None:
        """The search's cost cap in seconds: ``max_cost`` of the run at the rate of the setting it stands on."""
        # not the fastest trial's rate: one lucky short trial must not inflate every other's cost
        rate = self._incumbent.steps_per_sec if self._incumbent is not None else 0.0
        batches = self.planned()
        return self.max_cost * batches / rate if rate and batches else None

    def _spent(self, trial: Segment) -> bool:
        """A slow trial that alone would take the search past its cost cap ends now (its rate as measured)."""
        budget = self._budget_s()
        # four steps at least: a rate from fewer is the switch's noise, and the trial is then taken as measured
        if budget is None or len(trial.periods) < 4 or self.result.cost_s + trial.cost() < budget:
            return False
        # a trial reading faster than the setting in use costs nothing more per step: it runs to a trusted length
        return trial.cost() > trial.switch_s or trial.rate()[2] >= MIN_TRUSTED_BATCHES

    def _short_start(self, trial: Segment) -> bool:
        """The start, long enough to read its rate roughly, in a run too short to decide: it ends now, so the run
        says so up front (waiting for its precision, a noisy start outlasted a 5-s run and said nothing)."""
        if trial.against is not None or self.result.start is not None or len(trial.periods) < MIN_TRUSTED_BATCHES:
            return False
        if trial.total < self.min_seconds:
            return False
        return bool(self._too_short(Measured(trial.setting, len(trial.periods) / trial.total, math.inf, 0, 0.0)))

    def _first_moves(self, start: Measured) -> list[Setting]:
        """From ``num_workers=0`` on a CPU run: the moves the start's load and compute per batch point to (below a
        hand-over's cost, the intra-op threads at 0 workers)."""
        loads, at = self.trial.loads if self.trial is not None else [], start.setting
        if at.num_workers or not self.space.tune_threads or len(loads) < 2 or not start.steps_per_sec:
            return []
        load = sum(loads) / len(loads)
        compute = max(0.0, 1.0 / start.steps_per_sec - load)
        pairs = first_workers(load, compute, self.space.cpus)[:FIRST_MOVES]
        if not pairs:
            # loading below a worker's hand-over cost: no worker count pays for itself, the threads are the moves
            # left (tiny, 2 cores: four worker trials first, and 0 workers + 1 thread read 15 s after the start)
            return list(self.space.thread_moves(at))
        return [replace(self.space.moved(at, workers), threads=threads) for workers, threads in pairs]

    def _too_short(self, start: Measured) -> str:
        """Why the run is too short to decide anything (``""``: it is not), from the start's rate and the cap."""
        rate, planned = start.steps_per_sec, self.planned()
        budget = self.max_cost * planned / rate if rate and planned else None
        # no cap at all (max_cost=0) is the user's choice, said as the cap's stop
        if not budget or not rate:
            return ""
        shortest = max(self.min_seconds, MIN_TRUSTED_BATCHES / rate)
        needed = SLOWER_TRIAL * shortest
        if budget >= needed:
            return ""
        enough = math.ceil(planned * needed / budget)  # type: ignore[operator]
        return (
            f"the run is too short to decide: its {self.max_cost:.0%} cost cap is {budget:.2f} s, and one trusted"
            f" trial ({shortest:.1f} s, {MIN_TRUSTED_BATCHES}+ batches) of a setting {SLOWER_TRIAL:.0%} slower"
            f" costs {needed:.2f} s; the start stays; a run of {enough}+ steps, or"
            f" OnlineTuning(max_cost={min(1.0, self.max_cost * needed / budget):.2g}), lets it try"
        )

    def _next(self, measured: Measured) -> Setting | None:
        """A trial has ended: the search takes it; the setting to switch to (``None``: the one in use stays)."""
        result = self.result
        result.trials.append(measured)
        first = result.start is None
        result.start = result.start or measured
        self._incumbent = self._incumbent or measured
        current = measured.setting
        result.max_cost = self.max_cost
        if first and (short := self._too_short(measured)):
            # said once, up front, and nothing switched on noise
            result.notes.append(short)
            result.stop_reason = "the run is too short to decide"
            kept = self._decide(measured, current)
            self.watch = None
            return kept
        if self.search.phase is Phase.START:
            self.search.first = self._first_moves(measured)
        if self.search.measured(measured) is Phase.DONE:
            assert self.search.kept is not None
            return self._decide(self.search.kept, current)
        setting, against = self.search.ask
        # a trial the search took as the new incumbent is kept even where its switch spent the budget
        self._incumbent = against or self._incumbent
        if self._over_budget():
            # the setting the search stands on: a trial not yet confirmed against it is not kept, but said
            if self._unconfirmed():
                budget = self._budget_s() or 0.0
                result.cap_s, result.cap_left_s = budget, max(0.0, budget - result.cost_s)
            return self._decide(self._incumbent, current)
        if not self._fits(setting, self.search.precision, current):
            # a look cut by the run's end decides nothing: the rest of the run on the best measured beyond noise
            self._ran_out(RAN_OUT)
            return self._decide(self._incumbent, current)
        self.trial = Segment(setting, against, self.search.precision)
        return setting if setting != current else None

    def conclude(self) -> bool:
        """The fit ended mid-search: the setting it stood on is kept (a lead not confirmed is said); ``True`` where
        this decided (the start measured, nothing decided yet)."""
        # a search started again after a drift stands on the setting it had kept until its first look ends
        kept = self._incumbent or self.result.kept
        if self.trial is None or kept is None or self.result.done:
            return False
        self._ran_out(ENDED)
        self._decide(kept, kept.setting)
        self.watch = None
        return True

    def _ran_out(self, why: str) -> None:
        self.result.stop_reason = why
        if self._unconfirmed():
            self.result.unconfirmed_because = f"{why.split(':', maxsplit=1)[0]}; a longer run would settle it"

    def _unconfirmed(self) -> bool:
        """The search's lead over the setting it stands on, not confirmed, recorded to be said; ``True`` if any."""
        lead, incumbent = self.search.lead, self._incumbent
        if lead is None or incumbent is None or lead.setting == incumbent.setting:
            return False
        self.result.unconfirmed = lead
        return True

    def _decide(self, kept: Measured, current: Setting) -> Setting | None:
        result = self.result
        result.kept, result.done = kept, True
        result.stop_reason = result.stop_reason or "no neighbour of the kept setting was faster beyond noise"
        result.notes += [tie for tie in self.search.ties if tie not in result.notes]
        # the stalls as of this decision (a search after a drift says them again)
        result.notes = [note for note in result.notes if note != self._stalls_said]
        self._stalls_said = self.stalls.words()
        result.notes += [self._stalls_said] if self._stalls_said else []
        self.trial = None
        # with budget left, the kept setting's rate is watched for drift
        self.watch = None if self._over_budget() else Segment(kept.setting, None)
        return kept.setting if kept.setting != current else None

    def _over_budget(self) -> bool:
        """The slower trials already cost ``max_cost`` of the run."""
        budget = self._budget_s()
        over = budget is not None and self.result.cost_s >= budget
        if over:
            self.result.stop_reason = f"the trials had cost {self.max_cost:.1%} of the run"
        return over

    def _watching(self, period: float) -> None:
        """After the search: a window's rate against the kept setting's; drift twice in a row starts a new search."""
        watch, kept = self.watch, self.result.kept
        assert watch is not None and kept is not None
        watch.add(period)
        if not self._full(watch):
            return
        rate, error, _ = watch.rate()
        moved = abs(rate / kept.steps_per_sec - 1) if kept.steps_per_sec else 0.0
        # twice in a row: one window can read a passing load (a checkpoint, another process), not the pipeline
        self._drifts = self._drifts + 1 if moved > max(DRIFT, 3 * math.hypot(error, kept.error)) else 0
        self.watch = Segment(kept.setting, None)
        if self._drifts < 2:
            return
        self._drifts, self.watch, self._incumbent = 0, None, None
        self.result.looks, self.result.done, self.result.stop_reason = self.result.looks + 1, False, ""
        # the kept setting itself is measured again first: no switch
        self.search = NeighbourSearch(kept.setting, self.space)
        self.trial = Segment(kept.setting, None)


def _rate_of(measured: Measured) -> tuple[float, float]:
    return measured.steps_per_sec, measured.error


def planned_batches(max_epochs: int | None, max_steps: int | None, per_epoch: float | None) -> float | None:
    """The run's planned training steps: the nearer of ``max_epochs`` x ``per_epoch`` and ``max_steps``
    (``None``: unknown or unbounded; Lightning sets ``max_epochs=-1`` and ``max_steps=-1`` for "no bound").

    Example::

        planned_batches(max_epochs=-1, max_steps=3000, per_epoch=500.0)   # 3000.0
    """
    bounds = []
    if max_epochs and max_epochs > 0 and per_epoch and per_epoch != float("inf"):
        bounds.append(float(max_epochs * per_epoch))
    if max_steps is not None and max_steps > 0:
        bounds.append(float(max_steps))
    return min(bounds) if bounds else None


def refusal(world_size: int, fast_dev_run: int | bool, overfit_batches: float) -> str:
    """Why the loop cannot run on this fit (``""``: it can). Under DDP (``world_size`` > 1) it runs: rank zero
    decides for every rank (``datamodule/online_ddp.py``)."""
    del world_size
    if fast_dev_run:
        return "fast_dev_run runs too few steps to measure"
    if overfit_batches:
        return "overfit_batches rebuilds the loader"
    return ""
