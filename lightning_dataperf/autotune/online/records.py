"""The online loop's records: a setting, its measurement, the settings around it, and what the loop kept."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

__all__ = ["Measured", "OnlineResult", "Setting", "SettingSpace"]


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
