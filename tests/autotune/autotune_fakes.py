"""What the autotune tests share: TrialRunner's stand-ins (FakeRunner, AveragingRunner), a Search over one, I/O-like
samples. The tests here import them by name: tests/autotune/conftest.py puts this folder on sys.path."""

from __future__ import annotations

import contextlib
import dataclasses
import threading

from lightning_dataperf.autotune.trial import Trial
from lightning_dataperf.testing import SleepingLoaderDataset


class SlowSamples(SleepingLoaderDataset):
    """I/O-like samples: a short sleep each, so more workers help."""

    def __getitem__(self, index):
        threading.Event().wait(0.002)
        return super().__getitem__(index)


class FakeRunner:
    """Stands in for TrialRunner: rates from a function of the configuration, no processes, no clocks."""

    def __init__(self, rate, bounds=None, busy=0.05, sharing_rate=None):
        self.rate, self.bounds, self.busy = rate, bounds or {}, busy
        self.sharing_rate = sharing_rate or rate  # the rates when the workers send by file name
        self.trials, self.remaining, self.measured, self.remeasured, self.scales = {}, 100.0, [], [], []
        self.timing = {}  # workers -> (work_s, main_s) the fake trials report
        self.sharing, self.shared, self.earlier = None, [], []
        self.wait_share = None  # the main thread's wait share the fake trials report
        self._held, self.released = [], []
        self.last_cut = None  # as TrialRunner: what cut the last trial short (none: these are never cut)

    def _rate(self, key, sharing):
        return (self.sharing_rate if sharing else self.rate)(*key)

    def measure(self, workers, prefetch, pin, against=None):
        key = (workers, prefetch if workers else None, pin)
        if key not in self.trials:
            self.measured.append(key)
            work_s, main_s = self.timing.get(workers, (None, None))
            rate = self._rate(key, self.sharing)
            self.trials[key] = Trial(*key, rate, batches=20, worker_busy=self.busy, work_s=work_s, main_s=main_s,
                                     sharing=self.sharing, wait_share=self.wait_share)  # fmt: skip
        return self.trials[key]

    def measure_sharing(self, trial, strategy):
        self.shared.append(trial.config)
        other = Trial(*trial.config, self._rate(trial.config, strategy), batches=20, worker_busy=self.busy,
                      sharing=strategy)  # fmt: skip
        self.earlier.append(other)
        return other

    def latest(self, trial):
        if trial.sharing == self.sharing:
            return self.trials.get(trial.config, trial)
        return next((kept for kept in reversed(self.earlier) if kept.measured_as == trial.measured_as), trial)

    def adopt(self, trial):
        self.earlier = [kept for kept in self.earlier if kept is not trial] + list(self.trials.values())
        self.trials, self.sharing = {trial.config: trial}, trial.sharing

    def remeasure(self, trial, cap_scale=1.0, against=None):
        self.remeasured.append(trial.config)
        self.scales.append(cap_scale)
        again = dataclasses.replace(trial, batches_per_sec=self._rate(trial.config, trial.sharing), measurements=2)
        if trial.sharing == self.sharing:  # stored where TrialRunner stores it
            self.trials[trial.config] = again
        else:
            self.earlier = [again if kept.measured_as == trial.measured_as else kept for kept in self.earlier]
        return again

    def worker_bounds(self, prefetch, pin):
        return dict(self.bounds)

    def release(self, seconds):  # as TrialRunner: the innermost reserve is given back early, once
        given = min(seconds, self._held[-1] if self._held else 0.0)
        if self._held:
            self._held[-1] -= given
        self.remaining += given
        self.released.append(given)

    @contextlib.contextmanager
    def reserved(self, seconds):
        self.remaining -= seconds
        self._held.append(seconds)
        try:
            yield
        finally:
            self.remaining += self._held.pop()


def search_with(runner, cpus=2, min_workers=1):
    from lightning_dataperf.autotune.search import Search
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(30.0, 200, 0.03, 0.5, None, min_workers)
    return Search(runner, {}, (False,), limits)


class AveragingRunner(FakeRunner):
    """Looks from a list per worker count (the last one from then on); a repeat averages as TrialRunner's does."""

    def __init__(self, looks, **options):
        self.looks = {workers: list(values) for workers, values in looks.items()}
        super().__init__(self._look, sharing_rate=lambda *config: 10.0, **options)

    def _look(self, workers, prefetch, pin):
        values = self.looks[workers]
        return values.pop(0) if len(values) > 1 else values[0]

    def remeasure(self, trial, cap_scale=1.0, against=None):
        self.remeasured.append(trial.config)
        count = trial.measurements
        mean = (trial.batches_per_sec * count + self._rate(trial.config, trial.sharing)) / (count + 1)
        again = dataclasses.replace(trial, batches_per_sec=mean, measurements=count + 1)
        self.trials[trial.config] = again
        return again
