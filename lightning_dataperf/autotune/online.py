"""The loop's records and its search: the settings around a start, which one to try next, and which one wins."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from lightning_dataperf.autotune.noise import ahead, faster, gap

__all__ = ["Measured", "NeighbourSearch", "OnlineResult", "Phase", "Setting", "SettingSpace"]


@dataclass(frozen=True)
class Setting:
    """One point the loop can try: the loader's settings and the training process's intra-op threads."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    threads: int

    def describe(self) -> str:
        prefetch = f", prefetch_factor={self.prefetch_factor}" if self.num_workers else ""
        return f"num_workers={self.num_workers}{prefetch}, pin_memory={self.pin_memory}, threads={self.threads}"


@dataclass(frozen=True)
class Measured:
    """A setting's steady step rate on the real training steps, and what trying it cost."""

    setting: Setting
    steps_per_sec: float
    error: float
    """Relative standard error of ``steps_per_sec`` (``inf`` when it was cut before two rounds)."""
    batches: int
    seconds: float
    switch_s: float = 0.0
    """Seconds the switch to this setting stalled training (old workers stopped, new ones started)."""
    cost_s: float = 0.0
    """What trying it cost: its seconds beyond the setting it stood in for would have taken, and the switch's stall."""

    def pooled(self, again: Measured) -> Measured:
        """The two measurements of one setting as one (batch-weighted rate, the mean's error)."""
        batches, seconds = self.batches + again.batches, self.seconds + again.seconds
        error = math.hypot(self.error, again.error) / 2
        cost = self.cost_s + again.cost_s
        return replace(
            self, steps_per_sec=batches / seconds, error=error, batches=batches, seconds=seconds, cost_s=cost
        )


@dataclass(frozen=True)
class SettingSpace:
    """The settings the loop may try around a starting point (bounded by the machine)."""

    max_workers: int
    cpus: int
    tune_threads: bool
    """CPU runs: the training process's intra-op threads compete with the workers for the cores."""
    tune_pinning: bool
    """CUDA runs without the side stream: pinned and pageable host memory are both tried."""

    def neighbours(self, at: Setting) -> Iterator[Setting]:
        """Worker counts up (the larger move first) and down (on a CPU run each also with the cores they leave as
        intra-op threads), then threads, prefetch and pinning at ``at``'s workers."""
        workers = at.num_workers
        ups = [2 * workers, workers * 3 // 2, workers + 1] if workers else [2, 1]
        # one at a time, a climb from 4 workers to the H200's 24 took 11 trials and did not end in 120 s
        counts = list(dict.fromkeys(count for count in ups if workers < count <= self.max_workers))
        if workers > 3:  # after a doubling overshot: halfway back, then the half
            counts += list(dict.fromkeys([workers * 3 // 4, workers // 2]))
        elif workers:
            counts.append(workers - 1)
        for count in counts:
            moved = self._with_workers(at, count)
            yield moved
            # workers and intra-op threads share the cores: a move of one alone can hide the pair that wins
            if self.tune_threads and (left := max(1, self.cpus - count)) != at.threads:
                yield replace(moved, threads=left)
        if self.tune_threads:
            for threads in sorted({1, max(1, self.cpus - workers), self.cpus} - {at.threads}):
                yield replace(at, threads=threads)
        if workers and at.prefetch_factor is not None and at.prefetch_factor < 8:
            yield replace(at, prefetch_factor=at.prefetch_factor * 2)
        if self.tune_pinning:
            yield replace(at, pin_memory=not at.pin_memory)

    @staticmethod
    def _with_workers(at: Setting, workers: int) -> Setting:
        prefetch = (at.prefetch_factor or 2) if workers else None
        return replace(at, num_workers=workers, prefetch_factor=prefetch)


@dataclass
class OnlineResult:
    """What the loop measured, what it kept, and what the trying cost."""

    start: Measured | None = None
    kept: Measured | None = None
    trials: list[Measured] = field(default_factory=list)
    done: bool = False
    stop_reason: str = ""
    looks: int = 0
    """Searches started again after the kept setting's step rate drifted."""

    @property
    def gain(self) -> float | None:
        """The kept setting's rate over the starting one's (measured on this run)."""
        if self.start is None or self.kept is None:
            return None
        return self.kept.steps_per_sec / self.start.steps_per_sec

    @property
    def cost_s(self) -> float:
        """Seconds the search cost the run: each trial's steps slower than the setting in use, and the switches."""
        return sum(trial.cost_s for trial in self.trials)

    def summary(self) -> str:
        if self.start is None:
            return f"online tuning: {self.stop_reason or 'nothing measured yet'}"
        if self.kept is None:
            return f"online tuning: still searching, {len(self.trials)} trials measured on this run's steps so far"
        seconds = sum(trial.seconds + trial.switch_s for trial in self.trials)
        words = f"{self.gain:.2f}x the start's {self.start.steps_per_sec:.1f} steps/s" if self.gain else ""
        return (
            f"online tuning kept {self.kept.setting.describe()}: {self.kept.steps_per_sec:.1f} steps/s, {words}"
            f" (measured on this run's steps, {len(self.trials)} trials in {seconds:.1f} s; cost"
            f" {self.cost_s:.1f} s; {self.stop_reason}"
            + (f"; looked again {self.looks} times after the step rate drifted" if self.looks else "")
            + ")"
        )


class Phase(enum.Enum):
    """Where the loop stands: what the setting in use is being measured for."""

    START = "measuring the setting it starts from"
    TRYING = "trying a neighbour against the setting in use"
    CLOSE_CALL_INCUMBENT = "a close call: the setting in use measured again"
    CLOSE_CALL_NEIGHBOUR = "a close call: the neighbour measured again"
    CONFIRMING = "the setting in use measured again before a faster neighbour is kept"
    WATCHING = "decided: the kept setting's step rate watched for drift"
    DONE = "done: the kept setting stays"


#: What the search asks for: the setting to measure next and the measurement a trial may be cut against.
Ask = tuple[Setting, Measured | None]

#: A neighbour faster than this is kept without measuring the setting in use again (each look costs a switch:
#: on the H200 a switch of 8-16 JPEG workers stalled training for seconds).
CONFIRM_BELOW = 0.25

#: A neighbour ahead by more than the noise floor but not beyond its error is measured this many times more
#: (each time beside the incumbent again): benchmarks/online.py's quickstart, 2 cores, kept 3 workers at 8%
#: below 4 with one look at each.
CLOSE_CALL_ROUNDS = 2


class NeighbourSearch:
    """Coordinate search over ``space`` from ``start``, one measurement at a time; :attr:`kept` once :attr:`phase`
    is :attr:`Phase.DONE`.

    A neighbour that reads faster beyond noise, by less than :data:`CONFIRM_BELOW`, is kept only after the
    incumbent, measured again right after it, still reads slower (so a drifting step rate cannot make a setting
    look faster). A neighbour ahead by less than its error is a close call: both are measured again, up to
    :data:`CLOSE_CALL_ROUNDS` times. A kept neighbour starts the search again from it; the search ends when
    none of the kept setting's neighbours wins.

    Example::

        search = NeighbourSearch(Setting(0, None, False, 2), SettingSpace(4, 2, True, False))
        while search.phase is not Phase.DONE:
            setting, against = search.ask
            search.measured(measure(setting, against))
        search.kept
    """

    def __init__(self, start: Setting, space: SettingSpace, noise: float = 0.03) -> None:
        self.space, self.noise = space, noise
        self.phase = Phase.START
        self.ask: Ask = (start, None)
        """The setting to measure next, and the measurement it is compared with (``None``: the incumbent itself)."""
        self.best: Measured | None = None
        """The incumbent: the setting the search stands on, as measured so far."""
        self.kept: Measured | None = None
        self._tried = {start}
        self._neighbours: Iterator[Setting] = iter(())
        self._trial: Measured | None = None
        self._rounds = 0

    def measured(self, measured: Measured) -> Phase:
        """Takes the measurement of :attr:`ask`'s setting; the phase it moves to (a new :attr:`ask` unless done)."""
        phase, best, trial = self.phase, self.best, self._trial
        if phase is Phase.START:
            self._climb_from(measured)
        elif phase is Phase.TRYING:
            self._judge(measured)
        elif phase is Phase.CLOSE_CALL_INCUMBENT:
            assert best is not None
            self.best = best.pooled(measured)
            self._ask(Phase.CLOSE_CALL_NEIGHBOUR, self._neighbour(), self.best)
        elif phase is Phase.CLOSE_CALL_NEIGHBOUR:
            assert trial is not None
            self._rounds += 1
            self._judge(trial.pooled(measured))
        elif phase is Phase.CONFIRMING:
            assert best is not None and trial is not None
            reference = best.pooled(measured)
            if self._faster(trial, reference):
                self._climb_from(trial)
            else:
                self.best = reference
                self._next_neighbour()
        else:
            raise RuntimeError(f"the search is done ({self.kept}): it asks for no more measurements")
        return self.phase

    def _neighbour(self) -> Setting:
        """The neighbour on trial."""
        assert self._trial is not None
        return self._trial.setting

    def _faster(self, trial: Measured, than: Measured) -> bool:
        return faster(trial.steps_per_sec, than.steps_per_sec, gap(trial.error, than.error, self.noise))

    def _ask(self, phase: Phase, setting: Setting, against: Measured | None) -> None:
        self.phase, self.ask = phase, (setting, against)

    def _climb_from(self, best: Measured) -> None:
        """``best`` is the incumbent: its neighbours are tried next."""
        self.best = best
        self._neighbours = self.space.neighbours(best.setting)
        self._next_neighbour()

    def _next_neighbour(self) -> None:
        assert self.best is not None
        for candidate in self._neighbours:
            if candidate in self._tried:
                continue
            self._tried.add(candidate)
            self._trial, self._rounds = None, 0
            self._ask(Phase.TRYING, candidate, self.best)
            return
        self.kept, self.phase = self.best, Phase.DONE

    def _judge(self, trial: Measured) -> None:
        """A neighbour's measurement (its looks pooled) against the incumbent: the next phase."""
        best = self.best
        assert best is not None
        self._trial = trial
        unsure = not self._faster(trial, best) and ahead(trial.steps_per_sec, best.steps_per_sec, self.noise)
        if unsure and self._rounds < CLOSE_CALL_ROUNDS:
            self._ask(Phase.CLOSE_CALL_INCUMBENT, best.setting, None)
        elif not self._faster(trial, best):
            self._next_neighbour()
        elif trial.steps_per_sec > best.steps_per_sec * (1 + CONFIRM_BELOW):
            # no drift that big comes with one switch: kept without a second look
            self._climb_from(trial)
        else:
            self._ask(Phase.CONFIRMING, best.setting, None)
