"""autotune_loader: a short measured search for DataLoader settings on the real dataset (see docs/autotune.md)."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset

from lightning_dataperf.autotune.cache import cache_key, default_cache_path, read_entry, write_entry
from lightning_dataperf.autotune.choice import CHOICE_RESERVE, choose
from lightning_dataperf.autotune.consumer import TransferPath
from lightning_dataperf.autotune.measures import gc_frozen
from lightning_dataperf.autotune.progress import make_progress
from lightning_dataperf.autotune.result import AutotuneResult
from lightning_dataperf.autotune.runner import (
    Limits,
    Trial,
    TrialRunner,
    confirmation_candidates,
    repeat_outliers,
)
from lightning_dataperf.autotune.search import Search
from lightning_dataperf.autotune.trial import rated
from lightning_dataperf.loader.main_rng import rng_restored
from lightning_dataperf.loader.policy import recommend_loader_settings
from lightning_dataperf.loader.settings import LoaderSettings
from lightning_dataperf.loader.sharing import FAST_HANDOVER, process_strategy
from lightning_dataperf.telemetry.hardware import Hardware, probe_hardware

__all__ = [
    "AutotuneResult",
    "TransferPath",
    "Trial",
    "autotune_loader",
    "confirmation_candidates",
    "default_cache_path",
    "not_map_style",
]


SEARCH_FIELDS = ("num_workers", "prefetch_factor", "pin_memory")


def not_map_style(dataset: Any) -> str | None:
    """Why the search cannot run on ``dataset`` (each trial reads its own slice of it by index), or ``None``."""
    kind = type(dataset).__name__
    if isinstance(dataset, IterableDataset):
        why = f"the dataset is a {kind}, an IterableDataset"
    elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        why = f"the dataset ({kind}) has no {'__getitem__' if hasattr(dataset, '__len__') else '__len__'}"
    else:
        return None
    return (
        f"autotune needs a map-style dataset (with __len__ and __getitem__: each trial reads its own slice of it by "
        f"index), and {why}. Measure on a map-style dataset of the same samples, or set num_workers and "
        "prefetch_factor yourself."
    )


#: Trial caps of the budget the climb leaves for the hand-over's trial (its workers' start-up and one
#: measurement), at most :data:`SHARING_SHARE` of the budget.
SHARING_TRIALS = 2
SHARING_SHARE = 0.15


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

    Example::

        from lightning_dataperf import autotune_loader

        result = autotune_loader(train_set, batch_size=64, loader_kwargs={"collate_fn": my_collate})
        print(result.format())          # the trials, the winner, why the search stopped
        print(result.summary_line())    # "autotune measured 16 workers ... at 3,810 samples/s; more gave nothing ..."
        loader = DataLoader(train_set, batch_size=64, shuffle=True, **result.settings.as_kwargs())
    """
    if time_budget <= 0 or batch_budget < 2:
        raise ValueError(
            f"autotune_loader(time_budget={time_budget}, batch_budget={batch_budget}): need a positive time budget "
            "and at least 2 batches per trial."
        )
    if (problem := not_map_style(dataset)) is not None:
        raise ValueError(f"autotune_loader: {problem}")
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
    handover_reserve = min(SHARING_TRIALS * limits.trial_cap, SHARING_SHARE * limits.time_budget)
    if process_strategy() == FAST_HANDOVER:  # the workers send by file name already: no such trial
        handover_reserve = 0.0
    search = Search(runner, fixed, pins, limits, hardware.cpus_per_rank, handover_reserve)
    # each trial's loader is collected after it; frozen, that walks only the search's objects
    with gc_frozen():
        try:
            return _climb(search, runner, policy, pins, limits, choose_within, batch_size)
        finally:
            runner.close()


def _climb(
    search: Search,
    runner: TrialRunner,
    policy: LoaderSettings,
    pins: tuple[bool, ...],
    limits: Limits,
    choose_within: float,
    batch_size: int,
) -> AutotuneResult:
    max_epochs = limits.max_epochs
    runner.learn_batch_size()
    start_pin = policy.pin_memory if policy.pin_memory in pins else pins[0]
    start = search.compare.config(max(limits.min_workers, policy.num_workers), policy.prefetch_factor, start_pin)
    # the policy's pick (what the memory guard lets through): the first trial, the floor
    baseline = best = runner.measure(*runner.resources.affordable(start))
    if baseline.rough and runner.remaining > 0:  # the start-up burst's rate cannot be the floor: a steady look
        baseline = best = runner.remeasure(baseline)
    # kept for choose() to resolve a close call
    with runner.reserved(CHOICE_RESERVE * limits.time_budget):
        best = search.climb_workers(best)  # as last measured (the climb's confirmations may measure it again)
        best = search.probe_fewer(best, baseline)
        best = search.tune_prefetch(best)
        best = search.tune_pin(best)
        repeat_outliers(runner)
    chosen = choose(search.compare, baseline, choose_within, seconds=CHOICE_RESERVE * limits.time_budget)
    search.stop_against(chosen)
    baseline = runner.latest(baseline)
    measured = rated(runner.all_trials())
    top = max(trial.batches_per_sec for trial in measured) if measured else chosen.batches_per_sec
    settings = _settings_from(chosen, max_epochs)
    return AutotuneResult(
        settings=settings,
        trials=tuple(runner.in_order()),  # as measured: the policy's pick first
        search_seconds=0.0,
        baseline_batches_per_sec=baseline.batches_per_sec,
        best_batches_per_sec=top,
        chosen_batches_per_sec=chosen.batches_per_sec,
        batch_size=batch_size,
        stop_reason=search.compare.stop_reason,
        stop_detail=search.compare.stop_detail,
        bounds=runner.worker_bounds(chosen.prefetch_factor, chosen.pin_memory),
        sharing_strategy=chosen.sharing,
        sharing_detail=search.handover.said_of(chosen, runner.sharing),
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
