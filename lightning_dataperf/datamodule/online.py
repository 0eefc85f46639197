"""``TunedDataModule(autotune="online")``: loader settings tried on the run's own training steps, the best kept."""

from __future__ import annotations

import math
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.data import DataLoader

from lightning_dataperf._lightning_hooks import (
    forget_persistent_iterator,
    queued_batches,
    shutdown_loader_iterator,
    validation_batches_seen,
)
from lightning_dataperf.autotune.online import (
    Measured,
    OnlineResult,
    Setting,
    SettingSpace,
    online_search,
    slower_for_sure,
)
from lightning_dataperf.autotune.trial import steady_rate
from lightning_dataperf.loader.seeding import number_batches, seed_batches_in_main_process
from lightning_dataperf.loader.wrapping import Layer, wrap_iterators

__all__ = ["OnlineIterator", "OnlineTuner", "attach_online", "make_online"]

Position = Callable[[], tuple[int, int]]

#: After the search, a window of steps whose rate moved this far from the kept setting's (and beyond three
#: standard errors), twice in a row, is drift: the loop looks again from the kept setting, within its cost cap.
DRIFT = 0.15


class _Trial:
    """The step periods of the setting in use, since it was switched to."""

    def __init__(self, setting: Setting, against: Measured | None) -> None:
        self.setting, self.against = setting, against
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
        arrivals = [0.0]
        for period in self.periods:
            arrivals.append(arrivals[-1] + period)
        return steady_rate(arrivals, max(1, self.setting.num_workers), skip=0)

    def measured(self, queued_out: int = 0) -> Measured:
        """Its steady rate, no higher than the rate the batches were made at: those queued as counting began
        (the workers' backlog from a switch's stall, up to ``workers x prefetch``) less those queued at its end
        were made before it (on the H200, 32 JPEG workers read 56 steps/s in the loop and 25 alone)."""
        _, error, counted = self.rate()
        seconds = sum(self.periods[:counted]) if counted else self.total
        batches = counted or len(self.periods)
        made, total = len(self.periods) - max(0, self.queued_in - queued_out), self.total
        if total and made * seconds < batches * total:  # batches / seconds stays the rate: a pooled look keeps it
            batches, seconds = max(0, made), total
        rate = batches / seconds if seconds else 0.0
        # the skipped burst counts as the switch's cost only beyond the steps it would have taken anyway
        stall = max(0.0, self.switch_s - (self.skipped * seconds / batches if batches else 0.0))
        measured = Measured(self.setting, rate, error, batches, seconds, stall)
        return replace(measured, cost_s=self.cost())

    def cost(self) -> float:
        """Its steps' time beyond the setting it stands in for (``against``, the one in use) and its switch."""
        rate = self.against.steps_per_sec if self.against is not None else 0.0
        slower = max(0.0, self.total - len(self.periods) / rate) if rate else 0.0
        return slower + (self.switch_s if self.against is not None else 0.0)


class OnlineTuner:
    """Drives :func:`~lightning_dataperf.autotune.online.online_search` from the training loader's iterator.

    Example::

        tuner = OnlineTuner(trainer, start, space, position=sampler.position, **(options or {}))
        sampler.position = tuner.position
        make_online(loader, tuner)
    """

    def __init__(
        self,
        trainer: Any,
        start: Setting,
        space: SettingSpace,
        position: Position,
        precision: float = 0.03,
        max_batches: int = 200,
        max_cost: float = 0.05,
        min_seconds: float = 1.0,
        max_seconds: float = 10.0,
    ) -> None:
        self.trainer, self.space, self._position = trainer, space, position
        self.precision, self.max_batches, self.max_cost = precision, max_batches, max_cost
        # a trial shorter than this reads the machine's moment (other processes, the scheduler), not the setting
        self.min_seconds, self.max_seconds = min_seconds, max_seconds
        self.result = OnlineResult()
        self.override: tuple[int, int] | None = None
        self.user_threads = torch.get_num_threads()
        self._search = online_search(start, space)
        first, _ = next(self._search)
        self.trial: _Trial | None = _Trial(first, None)
        self._last: tuple[float, Any] | None = None
        self._incumbent: Measured | None = None
        self._watch: _Trial | None = None
        self._drifts = 0
        self.queued: Callable[[], int] = lambda: 0
        """Batches the loader's workers made that training has not taken yet (set by the iterator in use)."""

    def position(self) -> tuple[int, int]:
        """Where the sampler starts: the tuner's own count while it rebuilds, else Lightning's loop counters."""
        return self.override if self.override is not None else self._position()

    def restart_segment(self, burst: int) -> None:
        """A new iterator (an epoch's, or a switch's): the next ``burst`` periods are its start-up."""
        self._last = None
        for segment in (self.trial, self._watch):
            if segment is not None:
                segment.skip, segment.fresh = max(segment.skip, burst), True

    def step(self, now: float) -> Setting | None:
        """Called before each batch is fetched: records the step period that ended; the setting to switch to."""
        trial = self.trial
        if trial is None and self._watch is None:
            return None
        # a period with validation or an epoch's end in it is not a training step's
        marker = (self.trainer.current_epoch, validation_batches_seen(self.trainer))
        last, self._last = self._last, (now, marker)
        if last is None or last[1] != marker:
            return None
        if trial is None:
            self._watching(now - last[0])
            return None
        if trial.add(now - last[0]):
            trial.queued_in += self.queued()
        if self._full(trial) or self._spent(trial) or self._decided(trial):
            return self._next(trial.measured(self.queued()))
        return None

    def _decided(self, trial: _Trial) -> bool:
        """Its rate known to ``precision``, or so far behind the setting in use that no longer trial makes a tie."""
        if len(trial.periods) < trial.next_look:
            return False
        trial.next_look = len(trial.periods) + max(1, len(trial.periods) // 8)
        rate, error, counted = trial.rate()
        enough = counted >= max(8, 3 * max(1, trial.setting.num_workers)) and error <= self.precision
        enough = enough and trial.total >= self.min_seconds
        cut = trial.against is not None and counted >= 8 and trial.total >= self.min_seconds / 2
        return enough or (cut and slower_for_sure(rate, error, trial.against))

    def _full(self, segment: _Trial) -> bool:
        """At its cap: ``max_batches`` steps, but not under ``min_seconds`` (200 steps of tiny batches took 0.17 s on
        2 cores: a trial that short reads the machine's moment), or ``max_seconds``."""
        seconds = segment.total
        return seconds >= self.max_seconds or (len(segment.periods) >= self.max_batches and seconds >= self.min_seconds)

    def _budget_s(self) -> float | None:
        """The search's cost cap in seconds: ``max_cost`` of the run at the rate of the setting it stands on."""
        # not the fastest trial's rate: one lucky short trial must not inflate every other's cost
        rate = self._incumbent.steps_per_sec if self._incumbent is not None else 0.0
        batches = _planned_batches(self.trainer)
        return self.max_cost * batches / rate if rate and batches else None

    def _spent(self, trial: _Trial) -> bool:
        """A slow trial that alone would take the search past its cost cap ends now (its rate as measured)."""
        budget = self._budget_s()
        return budget is not None and len(trial.periods) >= 4 and self.result.cost_s + trial.cost() >= budget

    def _next(self, measured: Measured) -> Setting | None:
        result = self.result
        result.trials.append(measured)
        result.start = result.start or measured
        self._incumbent = self._incumbent or measured
        current = measured.setting
        try:
            setting, against = self._search.send(measured)
            # a trial the search took as the new incumbent is kept even where its switch spent the budget
            self._incumbent = against or self._incumbent
            if self._over_budget():
                self._search.close()
                # the setting the search stands on: a trial not yet confirmed against it is not kept
                raise StopIteration(self._incumbent)
        except StopIteration as stop:
            result.kept, result.done = stop.value, True
            result.stop_reason = result.stop_reason or "no neighbour of the kept setting was faster beyond noise"
            self.trial = None
            # with budget left, the kept setting's rate is watched for drift
            self._watch = None if self._over_budget() else _Trial(stop.value.setting, None)
            rank_zero_info(result.summary())
            return stop.value.setting if stop.value.setting != current else None
        self.trial = _Trial(setting, against)
        return setting if setting != current else None

    def _over_budget(self) -> bool:
        """The slower trials already cost ``max_cost`` of the run."""
        budget = self._budget_s()
        over = budget is not None and self.result.cost_s >= budget
        if over:
            self.result.stop_reason = f"the trials had cost {self.max_cost:.1%} of the run"
        return over

    def _watching(self, period: float) -> None:
        """After the search: a window's rate against the kept setting's; drift twice in a row starts a new search."""
        watch, kept = self._watch, self.result.kept
        assert watch is not None and kept is not None
        watch.add(period)
        if not self._full(watch):
            return
        rate, error, _ = watch.rate()
        moved = abs(rate / kept.steps_per_sec - 1) if kept.steps_per_sec else 0.0
        self._drifts = self._drifts + 1 if moved > max(DRIFT, 3 * math.hypot(error, kept.error)) else 0
        self._watch = _Trial(kept.setting, None)
        if self._drifts < 2:
            return
        self._drifts, self._watch, self._incumbent = 0, None, None
        self.result.looks, self.result.done, self.result.stop_reason = self.result.looks + 1, False, ""
        self._search = online_search(kept.setting, self.space)
        first, _ = next(self._search)  # the kept setting itself, measured again: no switch
        self.trial = _Trial(first, None)

    def switched(self, switch_s: float, setting: Setting) -> None:
        if self.trial is not None:
            self.trial.switch_s += switch_s
        torch.set_num_threads(setting.threads)

    def close(self) -> None:
        """At teardown: the user's intra-op threads back (the kept setting lasts as long as the fit)."""
        torch.set_num_threads(self.user_threads)


def _planned_batches(trainer: Any) -> float | None:
    epochs, per_epoch = getattr(trainer, "max_epochs", None), getattr(trainer, "num_training_batches", None)
    if not epochs or epochs < 0 or not per_epoch or per_epoch == float("inf"):
        return None
    return float(epochs * per_epoch)


class OnlineIterator(Iterator[Any]):
    """A training epoch's iterator that rebuilds the iterator beneath it (``make_inner``) at a batch boundary."""

    def __init__(self, loader: DataLoader, tuner: OnlineTuner, make_inner: Callable[[], Iterator[Any]]) -> None:
        self.loader, self.tuner, self.make_inner = loader, tuner, make_inner
        self.epoch, self.first = tuner.position()
        self.yielded = 0
        self.inner: Iterator[Any] | None = make_inner()
        own = weakref.ref(self)  # held weakly: an iterator kept alive by the tuner keeps its workers past the fit
        tuner.queued = lambda: queued_batches(iterator.inner) if (iterator := own()) is not None else 0
        tuner.restart_segment(_burst(loader))

    def __next__(self) -> Any:
        setting = self.tuner.step(time.perf_counter())
        if setting is not None:
            self._switch(setting)
        assert self.inner is not None
        batch = next(self.inner)
        self.tuner.override = None
        self.yielded += 1
        return batch

    def _switch(self, setting: Setting) -> None:
        started = time.perf_counter()
        self.close()
        loader = self.loader
        loader.num_workers = setting.num_workers
        loader.prefetch_factor = setting.prefetch_factor
        loader.pin_memory = setting.pin_memory
        self.tuner.override = (self.epoch, self.first + self.yielded)
        # a new iterator draws its base seed: from a forked generator, so the model's own draws do not move
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # the loop's own trial of more workers than PyTorch suggests is not the user's setting
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            self.inner = self.make_inner()
        self.tuner.switched(time.perf_counter() - started, setting)
        self.tuner.restart_segment(_burst(loader))

    def close(self) -> None:
        """Stop this iterator's workers now (a persistent loader's iterator is dropped, so it is not reused)."""
        if self.loader.persistent_workers:
            forget_persistent_iterator(self.loader)
        shutdown_loader_iterator(self.inner)
        self.inner = None

    def __del__(self) -> None:
        if getattr(self, "inner", None) is not None and not self.loader.persistent_workers:
            shutdown_loader_iterator(self.inner)


def _burst(loader: DataLoader) -> int:
    """Batches a new iterator's workers had queued while the others started: not the steady rate.

    At most a quarter of an epoch: each epoch skips its burst again, and 32 workers x 4 prefetched would skip
    all 125 batches of the H200 JPEG benchmark's epoch, a trial that never measures.
    """
    if not loader.num_workers:
        return 1
    queued = loader.num_workers * (loader.prefetch_factor or 1)
    try:
        return max(1, min(queued, len(loader) // 4))
    except TypeError:  # an iterable dataset without a length
        return queued


class _OnlineWrapper:
    """The loop's wrapper of a loader's iterators (:attr:`~lightning_dataperf.loader.wrapping.Layer.ONLINE`)."""

    def __init__(self, tuner: OnlineTuner) -> None:
        # the last iterator, held weakly: one kept alive here would keep its workers alive past the fit
        self.tuner, self.active = tuner, None

    def __call__(self, loader: DataLoader, make_inner: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        if self.active is not None and (iterator := self.active()) is not None and not loader.persistent_workers:
            # last epoch's iterator, left unfinished (limit_train_batches); a persistent one is reused
            iterator.close()
        iterator = OnlineIterator(loader, self.tuner, make_inner)
        self.active = weakref.ref(iterator)
        return iterator


def make_online(loader: DataLoader, tuner: OnlineTuner) -> None:
    """Make ``loader``'s iterators :class:`OnlineIterator` (a copy Lightning rebuilt from it iterates plainly)."""
    wrap_iterators(loader, _OnlineWrapper(tuner), Layer.ONLINE, replace=True)


def attach_online(
    loader: DataLoader,
    trainer: Any,
    cpus: int,
    notes: list[str],
    seeding: tuple[int, int],
    options: dict[str, Any] | None = None,
) -> OnlineTuner | None:
    """The tuner for the training ``loader``, or ``None`` with the reason in ``notes`` where the loop cannot run.

    ``options``: :class:`OnlineTuner`'s ``precision``, ``max_batches`` (per trial) and ``max_cost`` (share of the run).
    """
    sampler = loader.sampler
    refusal = _refusal(trainer)
    if refusal:
        notes.append(f"online tuning off: {refusal}; the loader keeps the settings above")
        return None
    device = trainer.strategy.root_device.type
    side_stream = "SideStream" in type(trainer.strategy).__name__
    start = Setting(loader.num_workers, loader.prefetch_factor, loader.pin_memory, torch.get_num_threads())
    space = SettingSpace(
        max_workers=max(2 * cpus, loader.num_workers),
        cpus=cpus,
        tune_threads=device == "cpu",
        tune_pinning=device == "cuda" and not side_stream,
    )
    tuner = OnlineTuner(trainer, start, space, position=sampler.position, **(options or {}))
    sampler.position = tuner.position
    # every batch is drawn from batch_seed(seed, epoch, rank, batch), in a worker or in this process alike
    numbered = number_batches(loader)
    seed_batches_in_main_process(loader, *seeding, tuner.position)
    make_online(loader, tuner)
    notes.append(
        "online tuning: these settings are the start; neighbouring settings are tried on the training steps"
        " and the fastest kept (same samples in the same order; the result in TunedDataModule.online_result)"
        + ("; each batch's random draws are keyed by its number, whatever the workers" if numbered else "")
    )
    return tuner


def _refusal(trainer: Any) -> str:
    if trainer.world_size > 1:
        return "it tunes one process (under DDP use autotune=True, which searches on rank zero)"
    if trainer.fast_dev_run:
        return "fast_dev_run runs too few steps to measure"
    if trainer.overfit_batches:
        return "overfit_batches rebuilds the loader"
    return ""
