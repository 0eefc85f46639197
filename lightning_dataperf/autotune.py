"""Measured DataLoader autotuning: a short hill-climb on the user's real dataset, the way training consumes it.

Every trial runs the batches through the path training will use (:class:`TransferPath`: the stock
``non_blocking`` copy or the side stream, the ``device_transform``, and a step as busy as training when
its time or function is given), so settings that steal CPU from the main thread lose. From the
hardware policy's recommendation the search

1. grows ``num_workers`` while the gain holds (x2 steps while each worker is mostly idle, as an
   I/O-latency loader is; x1.5 when busy), never past the smallest of the machine's bounds
   (:meth:`TrialRunner.worker_bounds`: ``/dev/shm``, memory per worker measured in the trials, file
   descriptors, the rank's CPU share divided by each worker's measured busy share, the dataset), and
   tries one count between the last gain and the first miss; if fewer workers are as fast, it goes
   down instead;
2. doubles ``prefetch_factor`` while that gains, then tries the other ``pin_memory`` where the path
   allows both (the side stream wants pinned batches from the loader: only ``True``);
3. repeats a trial whose rate is an outlier against its neighbours, the two trials whose comparison
   ends the climb, and those a close call between the fastest depends on.

A trial's rate excludes the worker start-up (kept apart as ``startup_s``; it decides
``persistent_workers``) and stops as soon as it is known within ``precision``. The cheapest
configuration within ``choose_within`` of the fastest wins. The result records why the search
stopped (``stop_reason``: ``"gain"``, a bound's name, ``"time budget"``, ...), each trial's time and
the total; :meth:`AutotuneResult.summary_line` says it in one line.

The search never leaves anything behind: every trial loader is shut down, trial loaders draw from
their own ``torch.Generator`` and the global RNGs are restored, so the training order is the same as
without autotuning. Results are cached in JSON keyed by hardware, dataset fingerprint (including its
``transform``), batch size, collate function and the transfer path.

Example::

    from lightning_dataperf import autotune_loader

    result = autotune_loader(train_set, batch_size=64, loader_kwargs={"collate_fn": my_collate})
    print(result.format())          # the trials, the winner, why the search stopped
    print(result.summary_line())    # "autotune measured 16 workers ... at 3,810 samples/s; more gave nothing ..."
    loader = DataLoader(train_set, batch_size=64, shuffle=True, **result.settings.as_kwargs())
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from lightning_dataperf.autotune_cache import cache_key, default_cache_path, read_entry, write_entry
from lightning_dataperf.autotune_consumer import TransferPath
from lightning_dataperf.autotune_progress import make_progress
from lightning_dataperf.autotune_result import AutotuneResult
from lightning_dataperf.autotune_trials import (
    Limits,
    Trial,
    TrialRunner,
    cheapest_near,
    confirmation_candidates,
)
from lightning_dataperf.hardware import Hardware, probe_hardware
from lightning_dataperf.loaders import LoaderSettings
from lightning_dataperf.policy import recommend_loader_settings
from lightning_dataperf.seeding import rng_restored

__all__ = [
    "AutotuneResult",
    "TransferPath",
    "Trial",
    "autotune_loader",
    "confirmation_candidates",
    "default_cache_path",
]

SEARCH_FIELDS = ("num_workers", "prefetch_factor", "pin_memory")
#: Most doublings of ``prefetch_factor`` tried.
MAX_PREFETCH = 16
#: A trial slower than this share of its neighbours (or of the best, at the end of the climb) is measured again.
OUTLIER_SHARE = 0.8

Config = tuple[int, int | None, bool]


def autotune_loader(
    dataset: Dataset,
    batch_size: int,
    loader_kwargs: Mapping[str, Any] | None = None,
    *,
    hardware: Hardware | None = None,
    device: torch.device | str | None = None,
    path: TransferPath | None = None,
    side_stream: bool = False,
    device_transform: Callable[[Any], Any] | None = None,
    step_seconds: float = 0.0,
    host_step_seconds: float = 0.0,
    step_fn: Callable[[Any], Any] | None = None,
    time_budget: float = 30.0,
    batch_budget: int = 400,
    noise: float = 0.03,
    precision: float = 0.03,
    choose_within: float = 0.02,
    trial_seconds: float | None = None,
    memory_fraction: float = 0.5,
    max_epochs: int | None = None,
    min_workers: int = 0,
    cache_path: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Any = "auto",
) -> AutotuneResult:
    """Search the fastest cheap DataLoader settings for ``dataset`` on this machine.

    Args:
        dataset: the real training dataset (map-style; read, never modified by the search).
        batch_size: the training batch size.
        loader_kwargs: your other DataLoader arguments (``collate_fn``, ``drop_last``, ...); any of
            ``num_workers``, ``prefetch_factor``, ``pin_memory`` given here are kept fixed.
        hardware: the probe to budget CPUs and memory by (per-rank CPUs under DDP).
        device: where batches go (default: CUDA if available); each trial copies them there.
        path: the whole transfer path (overrides ``side_stream`` .. ``step_fn``); see :class:`TransferPath`.
        side_stream: copy on a side stream as ``strategy="side_stream"`` does (only pinned loaders are tried).
        device_transform: run on each device batch after the copy, as the strategy's.
        step_seconds: the model step's time: GPU time on CUDA (``torch.cuda._sleep``), a main-thread
            busy-wait otherwise. Without it trials measure the loader and the copy alone.
        host_step_seconds: main-thread host work per step on top of that (a busy-wait).
        step_fn: your step, called with each device batch (instead of ``step_seconds``).
        time_budget: most seconds for the whole search (it usually ends sooner, when the gain stops).
        batch_budget: most batches per trial.
        noise: relative gain a step must beat to count.
        precision: a trial stops once its rate's relative standard error is below this.
        choose_within: the cheapest configuration within this share of the fastest wins.
        trial_seconds: most seconds per trial (default: a fifteenth of the budget, at least 1 s).
        memory_fraction: refuse configurations whose ``/dev/shm`` plus pinned bytes exceed this
            fraction of what is free (also the share of RAM the workers' own memory may take).
        max_epochs: planned epochs, for ``persistent_workers``.
        min_workers: fewest workers to consider. Loading in the main process (0) can deliver more
            batches/s to an idle consumer on a small machine, but it cannot overlap with a training
            step; ``TunedDataModule`` therefore searches from 1.
        cache_path: JSON cache (default :func:`default_cache_path`).
        force: search again even when the cache has an answer.
        progress: ``"auto"`` (a bar on a terminal, log lines otherwise), ``"bar"``, ``"log"``, or
            ``False`` for silence.
    """
    if time_budget <= 0 or batch_budget < 2:
        raise ValueError(
            f"autotune_loader(time_budget={time_budget}, batch_budget={batch_budget}): need a positive time budget "
            "and at least 2 batches per trial."
        )
    called = time.perf_counter()
    hardware = hardware or probe_hardware()
    loader_kwargs = dict(loader_kwargs or {})
    if path is None:
        if device is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device) if device is not None else None
        path = TransferPath(
            device=device,
            side_stream=side_stream,
            device_transform=device_transform,
            step_seconds=step_seconds,
            host_step_seconds=host_step_seconds,
            step_fn=step_fn,
        )
    key = cache_key(hardware, dataset, batch_size, loader_kwargs, f"{path.describe()}|min_workers={min_workers}")
    cache = Path(cache_path) if cache_path is not None else default_cache_path()
    if not force and (hit := _cached(cache, key)) is not None:
        now = time.perf_counter()
        return dataclasses.replace(hit, cached=True, elapsed_s=now - called, ended_at=now)
    reporter = make_progress(progress)
    started = time.perf_counter()
    try:
        with rng_restored(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create")  # trying more is the point
            limits = Limits(
                time_budget, batch_budget, noise, memory_fraction, max_epochs, min_workers, precision, trial_seconds
            )
            result = _search(dataset, batch_size, loader_kwargs, hardware, path, limits, choose_within, reporter)
    except BaseException:
        reporter.close()
        raise
    now = time.perf_counter()
    result = dataclasses.replace(
        result, search_seconds=now - started, key=key, elapsed_s=now - called, ended_at=now, transfer=path.describe()
    )
    reporter.close(result)
    write_entry(cache, key, result.to_dict())
    return result


def _cached(path: Path, key: str) -> AutotuneResult | None:
    entry = read_entry(path, key)
    if entry is None:
        return None
    try:
        return AutotuneResult.from_dict(entry)
    except (KeyError, TypeError):  # written by another version: search again
        return None


class _Search:
    """One search's decisions over a :class:`TrialRunner`."""

    def __init__(self, runner: TrialRunner, fixed: Mapping[str, Any], pins: tuple[bool, ...], limits: Limits) -> None:
        self.runner, self.fixed, self.pins, self.limits = runner, fixed, pins, limits
        self.stop_reason, self.stop_detail = "", ""

    def config(self, workers: int, prefetch: int | None, pin: bool) -> Config:
        workers = self.fixed.get("num_workers", workers)
        prefetch = self.fixed.get("prefetch_factor", prefetch or 2) if workers else None
        return workers, prefetch, self.fixed.get("pin_memory", pin)

    def measure(self, workers: int, prefetch: int | None, pin: bool) -> Trial:
        return self.runner.measure(*self.config(workers, prefetch, pin))

    def better(self, trial: Trial, than: Trial) -> bool:
        return trial.refused is None and trial.batches_per_sec > than.batches_per_sec * (1 + self.limits.noise)

    def as_fast(self, trial: Trial, than: Trial) -> bool:
        return trial.refused is None and trial.batches_per_sec >= than.batches_per_sec * (1 - self.limits.noise)

    def stop(self, reason: str, detail: str) -> None:
        if not self.stop_reason:
            self.stop_reason, self.stop_detail = reason, detail

    # ------------------------------------------------------------------ workers
    def climb_workers(self, best: Trial) -> Trial:
        """Up while the gain holds; if the first step up gains nothing, down while fewer are as fast."""
        if "num_workers" in self.fixed:
            self.stop("fixed", f"num_workers={best.num_workers} is yours")
            return best
        start = best
        best = self._ascend(best)
        if best.config != start.config or self.stop_reason != "gain":
            return best
        lower = self._fewer(start.num_workers)
        if lower is None or self.runner.remaining <= 0:
            return best
        trial = self.measure(lower, start.prefetch_factor, start.pin_memory)
        if not self.as_fast(trial, start):
            return best
        self.stop_reason = ""
        return self._descend(trial, start)

    def _fewer(self, workers: int) -> int | None:
        minimum = self.limits.min_workers
        if workers <= minimum:
            return None
        return max(minimum, workers // 2)

    def _descend(self, best: Trial, above: Trial) -> Trial:
        while (lower := self._fewer(best.num_workers)) is not None and self.runner.remaining > 0:
            trial = self.measure(lower, best.prefetch_factor or above.prefetch_factor, best.pin_memory)
            if not self.as_fast(trial, best):
                self.stop("fewer", f"{lower} workers lost {_change(trial, best)}; {above.num_workers} gained nothing")
                return best
            best = trial
        self.stop("fewer", f"fewer workers were as fast (down to {best.num_workers}, {above.num_workers} no faster)")
        return best

    def _ascend(self, best: Trial) -> Trial:
        runner = self.runner
        while True:
            bounds = runner.worker_bounds(best.prefetch_factor, best.pin_memory)
            name, limit = min(bounds.items(), key=lambda item: item[1]) if bounds else ("", math.inf)
            if best.num_workers >= limit:
                self.stop(name, f"stopped at the {name} bound: {limit} workers ({_bounds_text(bounds)})")
                return best
            if runner.remaining <= 0:
                self.stop("time budget", f"the time budget ran out at {best.num_workers} workers, still gaining")
                return best
            step = _next_workers(best, int(min(limit, 1 << 20)))
            trial = self.measure(step, best.prefetch_factor, best.pin_memory)
            if trial.refused is not None:
                self.stop("memory guard", f"{step} workers refused: {trial.refused}")
                return best
            if trial.batches_per_sec < OUTLIER_SHARE * best.batches_per_sec and trial.measurements == 1:
                trial = runner.remeasure(trial)  # more workers much slower: an artefact until seen twice
            if self.better(trial, best):
                best = trial
                continue
            if runner.remaining <= 0:  # the trial was cut short: it proves nothing
                self.stop("time budget", f"the time budget ran out measuring {step} workers")
                return best
            if best.measurements == 1 or trial.measurements == 1:  # the step that ends the climb, seen twice
                best, trial = runner.remeasure(best), runner.remeasure(trial)
                if self.better(trial, best):
                    best = trial
                    continue
            between = (best.num_workers + step) // 2
            if step - best.num_workers >= 3 and runner.remaining > 0:
                middle = self.measure(between, best.prefetch_factor, best.pin_memory)
                if self.better(middle, best):
                    self.stop("gain", f"more gave nothing ({step} workers: {_change(trial, middle)})")
                    return middle
            self.stop("gain", f"more gave nothing ({step} workers: {_change(trial, best)})")
            return best

    # ------------------------------------------------------------------ prefetch and pinning
    def tune_prefetch(self, best: Trial) -> Trial:
        if "prefetch_factor" in self.fixed or not best.num_workers:
            return best
        while (best.prefetch_factor or 2) * 2 <= MAX_PREFETCH and self.runner.remaining > 0:
            trial = self.measure(best.num_workers, (best.prefetch_factor or 2) * 2, best.pin_memory)
            if not self.better(trial, best):
                break
            best = trial
        return best

    def tune_pin(self, best: Trial) -> Trial:
        if "pin_memory" in self.fixed or len(self.pins) < 2 or self.runner.remaining <= 0:
            return best
        trial = self.measure(best.num_workers, best.prefetch_factor, not best.pin_memory)
        return trial if self.better(trial, best) else best

    # ------------------------------------------------------------------ honest numbers
    def repeat_outliers(self) -> None:
        """Measure again any trial much slower than both neighbours in worker count (a peak is real, a dip suspect)."""
        runner = self.runner
        groups: dict[tuple[int | None, bool], list[Trial]] = {}
        for trial in self._measured():
            if trial.num_workers:
                groups.setdefault((trial.prefetch_factor, trial.pin_memory), []).append(trial)
        for trials in groups.values():
            trials.sort(key=lambda trial: trial.num_workers)
            for left, middle, right in zip(trials, trials[1:], trials[2:], strict=False):
                low = min(left.batches_per_sec, right.batches_per_sec)
                outlier = middle.batches_per_sec < OUTLIER_SHARE * low  # a dip (start-up, memory artefacts)
                if outlier and middle.measurements == 1 and runner.remaining > 0:
                    runner.remeasure(runner.trials[middle.config])

    def confirm_close_calls(self, count: int = 3) -> None:
        """Measure again the fastest trials and the cheapest near them when they are within noise of each other."""
        measured = self._measured()
        if not measured:
            return
        top = max(trial.batches_per_sec for trial in measured)
        close = [trial for trial in measured if trial.batches_per_sec >= top * (1 - 2 * self.limits.noise)]
        if len(close) < 2:
            return
        for trial in confirmation_candidates(close, count, band=1 - 2 * self.limits.noise):
            if self.runner.remaining <= 0:
                return
            self.runner.remeasure(self.runner.trials[trial.config])

    def _measured(self) -> list[Trial]:
        return [trial for trial in self.runner.trials.values() if trial.refused is None and trial.batches > 1]


def _next_workers(best: Trial, limit: int) -> int:
    """The next worker count: x2 while each worker is mostly idle (latency-bound), x1.5 when busy."""
    workers = best.num_workers
    if workers == 0:
        return min(limit, 1)
    busy = best.worker_busy
    factor = 2.0 if busy is None or busy < 0.5 else 1.5
    return max(workers + 1, min(limit, round(workers * factor)))


def _change(trial: Trial, reference: Trial) -> str:
    if not reference.batches_per_sec:
        return "n/a"
    return f"{100 * (trial.batches_per_sec / reference.batches_per_sec - 1):+.0f}%"


def _bounds_text(bounds: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in sorted(bounds.items(), key=lambda item: item[1]))


def _search(
    dataset: Dataset,
    batch_size: int,
    loader_kwargs: dict[str, Any],
    hardware: Hardware,
    path: TransferPath,
    limits: Limits,
    choose_within: float,
    listener: Any,
) -> AutotuneResult:
    max_epochs = limits.max_epochs
    accelerator = path.device.type if path.device is not None else "cpu"
    policy = recommend_loader_settings(hardware, max_epochs=max_epochs, accelerator=accelerator)
    fixed = {name: loader_kwargs.pop(name) for name in SEARCH_FIELDS if name in loader_kwargs}
    loader_kwargs.pop("persistent_workers", None)
    runner = TrialRunner(dataset, batch_size, loader_kwargs, hardware, path, limits, listener)
    pins = path.pin_choices()
    search = _Search(runner, fixed, pins, limits)
    runner.learn_batch_size()
    start_pin = policy.pin_memory if policy.pin_memory in pins else pins[0]
    start = search.config(max(limits.min_workers, policy.num_workers), policy.prefetch_factor, start_pin)
    baseline = best = runner.measure(*runner.affordable(start))
    best = search.climb_workers(best)
    best = search.tune_prefetch(best)
    best = search.tune_pin(best)
    search.repeat_outliers()
    search.confirm_close_calls()
    baseline = runner.trials[baseline.config]
    measured = search._measured()
    top = max(trial.batches_per_sec for trial in measured) if measured else 0.0
    chosen = cheapest_near(measured, 1 - choose_within) or baseline
    settings = _settings_from(chosen, max_epochs)
    return AutotuneResult(
        settings=settings,
        trials=tuple(runner.trials.values()),
        search_seconds=0.0,
        baseline_batches_per_sec=baseline.batches_per_sec,
        best_batches_per_sec=top,
        chosen_batches_per_sec=chosen.batches_per_sec,
        batch_size=batch_size,
        stop_reason=search.stop_reason,
        stop_detail=search.stop_detail,
        bounds=runner.worker_bounds(chosen.prefetch_factor, chosen.pin_memory),
    )


def _settings_from(trial: Trial, max_epochs: int | None) -> LoaderSettings:
    persistent = trial.num_workers > 0 and max_epochs != 1
    reasons = {
        "num_workers": f"measured: {trial.batches_per_sec:.1f} batches/s, the cheapest within noise of the best",
        "prefetch_factor": "measured with num_workers",
        "pin_memory": "measured (includes the host-to-device copy)" if trial.pin_memory else "measured",
        "persistent_workers": (
            f"worker start-up measured at {trial.startup_s:.2f} s, paid every epoch unless kept alive"
            if persistent
            else "no workers or a single epoch"
        ),
    }
    return LoaderSettings(trial.num_workers, trial.pin_memory, persistent, trial.prefetch_factor, reasons)
