"""Autotune's trials: run one DataLoader configuration on the real dataset and measure batches/s.

:class:`TrialRunner` holds one search's state: the budgets, every :class:`Trial` measured so far,
the memory guard that refuses configurations whose batches in flight would not fit, and the fixed
sample order each trial reads a fresh slice of. Trial loaders draw from their own generator and are
shut down at once (workers and pin thread); :func:`rng_untouched` restores the global RNGs.

Example::

    runner = TrialRunner(dataset, 64, {}, hardware, device=None, limits=Limits(10.0, 200, 0.03, 0.5, None, 0))
    runner.learn_batch_size()
    trial = runner.measure(4, 2, False)      # Trial(num_workers=4, ..., batches_per_sec=...)
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from lightning.fabric.utilities.data import sized_len
from torch.utils.data import DataLoader, Dataset, Sampler

from lightning_dataperf._lightning_hooks import shutdown_loader_iterator
from lightning_dataperf.batches import BatchFootprint, map_tensors
from lightning_dataperf.hardware import Hardware
from lightning_dataperf.preflight import pinned_bytes

__all__ = ["Limits", "Trial", "TrialRunner", "cheapest_near", "confirmation_candidates", "rng_untouched"]

_MB = 2**20
#: Share of the time budget kept for re-measuring the best few configurations after the climb.
CONFIRM_SHARE = 0.2
#: The cheapest trial within this share of the best is re-measured too: the choice is the cheapest
#: configuration within noise of the best, and one unlucky measurement must not rule it out.
CONFIRM_BAND = 0.7
#: Confirmation rounds at most; more run only while the budget holds another round.
MAX_CONFIRM_ROUNDS = 4


@dataclass(frozen=True)
class Trial:
    """One measured (or refused) configuration."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    batches_per_sec: float = 0.0
    startup_s: float = 0.0
    batches: int = 0
    memory_mb: float = 0.0
    refused: str | None = None
    measurements: int = 1

    @property
    def config(self) -> tuple[int, int | None, bool]:
        return self.num_workers, self.prefetch_factor, self.pin_memory

    @property
    def cost(self) -> tuple[int, float, bool]:
        """Cheaper first: fewer workers, less memory in flight, no pinning."""
        return self.num_workers, self.memory_mb, self.pin_memory


@dataclass(frozen=True)
class Limits:
    """The knobs of one search that are not about the data."""

    time_budget: float
    batch_budget: int
    noise: float
    memory_fraction: float
    max_epochs: int | None
    min_workers: int


class _Offsets(Sampler[int]):
    """Each trial reads its own slice of a fixed permutation, so no trial rereads another's samples."""

    def __init__(self, order: list[int], start: int) -> None:
        self.order, self.start = order, start

    def __iter__(self) -> Iterator[int]:
        length = len(self.order)
        return (self.order[(self.start + step) % length] for step in range(length))

    def __len__(self) -> int:
        return len(self.order)


@contextlib.contextmanager
def rng_untouched() -> Iterator[None]:
    """Restore ``random``, NumPy and torch (CPU and CUDA) generator states afterwards."""
    python_state = random.getstate()
    numpy_state = None
    with contextlib.suppress(ImportError):
        import numpy

        numpy_state = numpy.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy_state is not None:
                import numpy

                numpy.random.set_state(numpy_state)


def confirmation_candidates(trials: list[Trial], count: int = 3, band: float = CONFIRM_BAND) -> list[Trial]:
    """The ``count`` fastest trials, then the cheapest trial within ``band`` of the fastest if not among them."""
    ranked = sorted(trials, key=lambda trial: trial.batches_per_sec, reverse=True)
    chosen = ranked[:count]
    cheapest = cheapest_near(ranked, band)
    if cheapest is not None and cheapest not in chosen:
        chosen.append(cheapest)
    return chosen


def cheapest_near(trials: list[Trial], share: float) -> Trial | None:
    """The cheapest trial at least ``share`` times as fast as the fastest (``None`` without trials)."""
    if not trials:
        return None
    top = max(trial.batches_per_sec for trial in trials)
    return min((trial for trial in trials if trial.batches_per_sec >= share * top), key=lambda trial: trial.cost)


class TrialRunner:
    """State of one search: budgets, the measured trials, the memory guard."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        loader_kwargs: Mapping[str, Any],
        hardware: Hardware,
        device: torch.device | None,
        limits: Limits,
    ) -> None:
        self.dataset, self.batch_size, self.loader_kwargs = dataset, batch_size, dict(loader_kwargs)
        self.hardware, self.device, self.limits = hardware, device, limits
        self.deadline = time.perf_counter() + limits.time_budget
        self.trials: dict[tuple[int, int | None, bool], Trial] = {}
        self.batch_bytes: int | None = None
        length = sized_len(dataset) or 0
        generator = torch.Generator().manual_seed(0)
        self.order = torch.randperm(length, generator=generator).tolist() if length else []
        self.offset = 0

    @property
    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    @property
    def climb_remaining(self) -> float:
        """Time left for the climb; the rest of the budget is kept for :meth:`confirm`."""
        return self.remaining - CONFIRM_SHARE * self.limits.time_budget

    def confirm(self, count: int = 3) -> None:
        """Re-measure the best ``count`` configurations and the cheapest near them, in rounds, keeping means.

        One lucky trial must not win, and one unlucky trial must not rule out the cheap choice. Each
        round measures its candidates back to back (so drift on a busy machine hits them alike); rounds
        repeat, up to ``MAX_CONFIRM_ROUNDS``, while the budget holds another one.
        """
        for _ in range(MAX_CONFIRM_ROUNDS):
            started = time.perf_counter()
            if not self._confirm_round(count):
                return
            if self.remaining < time.perf_counter() - started:
                return

    def _confirm_round(self, count: int) -> bool:
        """One measurement more of each candidate; ``False`` when the budget ran out on the way."""
        measured = [trial for trial in self.trials.values() if trial.refused is None and trial.batches > 1]
        for trial in confirmation_candidates(measured, count):
            if self.remaining <= 0:
                return False
            again = self._run(*trial.config)
            if again.batches > 1:
                rate = (trial.batches_per_sec * trial.measurements + again.batches_per_sec) / (trial.measurements + 1)
                self.trials[trial.config] = dataclasses.replace(
                    trial,
                    batches_per_sec=rate,
                    batches=trial.batches + again.batches,
                    measurements=trial.measurements + 1,
                )
        return True

    def learn_batch_size(self) -> None:
        """Load one batch in this process, so the memory guard knows the batch bytes before any trial."""
        kwargs = {key: value for key, value in self.loader_kwargs.items() if key in {"collate_fn", "drop_last"}}
        sampler = _Offsets(self.order, self.offset) if self.order else None
        batch = next(iter(DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler, **kwargs)))
        self.offset += self.batch_size
        self.batch_bytes = BatchFootprint.of(batch).bytes

    def affordable(self, config: tuple[int, int | None, bool]) -> tuple[int, int | None, bool]:
        """``config``, or the nearest one with fewer workers / less prefetch that the memory guard accepts."""
        workers, prefetch, pin = config
        while workers and self.refusal(workers, prefetch, pin) is not None:
            if prefetch and prefetch > 1:
                prefetch //= 2
            else:
                workers //= 2
        return workers, (prefetch if workers else None), pin

    def memory_mb(self, workers: int, prefetch: int | None, pin: bool) -> float:
        if self.batch_bytes is None:
            return 0.0
        in_flight = workers * (prefetch or 0) + 1
        pinned = pinned_bytes(self.batch_bytes, in_flight + 1) if pin else 0
        return (self.batch_bytes * in_flight + pinned) / _MB

    def refusal(self, workers: int, prefetch: int | None, pin: bool) -> str | None:
        need = self.memory_mb(workers, prefetch, pin)
        free = [self.hardware.ram_available_mb]
        if workers and self.hardware.shm_free_mb is not None:
            free.append(self.hardware.shm_free_mb)
        fraction = self.limits.memory_fraction
        if need > fraction * min(free):
            return f"needs ~{need:.0f} MB of /dev/shm and pinned RAM, over {100 * fraction:.0f}% of free"
        return None

    def measure(self, workers: int, prefetch: int | None, pin: bool) -> Trial:
        key = (workers, prefetch if workers else None, pin)
        if key in self.trials:
            return self.trials[key]
        if (reason := self.refusal(*key)) is not None:
            trial = Trial(*key, memory_mb=self.memory_mb(*key), refused=reason)
        else:
            trial = self._run(*key)
        self.trials[key] = trial
        return trial

    def _run(self, workers: int, prefetch: int | None, pin: bool) -> Trial:
        per_trial = max(0.25, min(self.remaining, self.limits.time_budget / 20))
        sampler = _Offsets(self.order, self.offset) if self.order else None
        kwargs = {
            key: value
            for key, value in self.loader_kwargs.items()
            if key not in {"shuffle", "sampler", "batch_sampler"}
        }
        kwargs.update(num_workers=workers, pin_memory=pin, generator=torch.Generator().manual_seed(0))
        if workers:
            kwargs["prefetch_factor"] = prefetch
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler, **kwargs)
        started = time.perf_counter()
        iterator = iter(loader)
        try:
            batches, startup, elapsed = self._drain(iterator, started, per_trial)
        finally:
            shutdown_loader_iterator(iterator)
            del iterator, loader
            gc.collect()
        self.offset += batches * self.batch_size
        rate = (batches - 1) / elapsed if batches > 1 and elapsed > 0 else 0.0
        return Trial(workers, prefetch, pin, rate, startup, batches, self.memory_mb(workers, prefetch, pin))

    def _drain(self, iterator: Iterator[Any], started: float, per_trial: float) -> tuple[int, float, float]:
        """Time to the first batch (start-up), then steady batches/s until the trial's time or batch budget."""
        batches, startup, steady_start = 0, 0.0, started
        copy = self.device is not None and self.device.type == "cuda"
        for batch in iterator:
            if copy:
                map_tensors(batch, lambda tensor: tensor.to(self.device, non_blocking=True))
            batches += 1
            now = time.perf_counter()
            if batches == 1:
                startup, steady_start = now - started, now
                if self.batch_bytes is None:
                    self.batch_bytes = BatchFootprint.of(batch).bytes
            enough = batches >= 3 and (batches > self.limits.batch_budget or now - started > per_trial)
            if enough or self.remaining <= 0:
                break
        if copy:
            torch.cuda.synchronize(self.device)
        return batches, startup, time.perf_counter() - steady_start
