"""Measured DataLoader autotuning: a short, bounded hill-climb on the user's real dataset.

Start from the hardware policy's recommendation, measure delivered batches per second (including the
pinned host-to-device copy when a GPU is there), try the neighbours of the current best on each knob
(``num_workers``, ``prefetch_factor``, ``pin_memory``), move along the knob with the largest gain, and
stop when no knob gains more than the noise. The best three, and the cheapest configuration within 30%
of the best, are then measured again in rounds (at least a fifth of the budget is kept for this, and
rounds repeat while the budget holds one), so that one lucky trial cannot win and one unlucky trial
cannot rule out the cheap choice. Of all configurations within
noise of the best, the cheapest (fewest workers, least memory) wins. ``persistent_workers`` does not change steady-state
throughput; it is chosen from the measured worker start-up cost and the number of epochs.

The search never leaves anything behind: every trial loader is shut down, trial loaders draw from
their own ``torch.Generator`` and the global RNGs are restored, so the training order is the same as
without autotuning. Results are cached in JSON keyed by hardware, dataset fingerprint, batch size and
collate function.

Example::

    from lightning_dataperf import autotune_loader

    result = autotune_loader(train_set, batch_size=64, loader_kwargs={"collate_fn": my_collate})
    print(result.format())
    loader = DataLoader(train_set, batch_size=64, shuffle=True, **result.settings.as_kwargs())
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from lightning_dataperf.autotune_cache import cache_key, default_cache_path, read_entry, write_entry
from lightning_dataperf.autotune_trials import (
    Limits,
    Trial,
    TrialRunner,
    cheapest_near,
    confirmation_candidates,
    rng_untouched,
)
from lightning_dataperf.hardware import Hardware, probe_hardware
from lightning_dataperf.loaders import LoaderSettings
from lightning_dataperf.policy import recommend_loader_settings

__all__ = ["AutotuneResult", "Trial", "autotune_loader", "confirmation_candidates", "default_cache_path"]

SEARCH_FIELDS = ("num_workers", "prefetch_factor", "pin_memory")


@dataclass(frozen=True)
class AutotuneResult:
    """The chosen settings, every trial, and how long the search took.

    Example::

        result = autotune_loader(dataset, batch_size=64)
        print(result.format())                  # the table of trials, the winner, the speed-up
        DataLoader(dataset, batch_size=64, **result.settings.as_kwargs())
    """

    settings: LoaderSettings
    trials: tuple[Trial, ...]
    search_seconds: float
    baseline_batches_per_sec: float
    best_batches_per_sec: float
    chosen_batches_per_sec: float
    cached: bool = False
    key: str = ""

    @property
    def speedup_over_start(self) -> float:
        """Chosen throughput over the policy's starting point."""
        return self.chosen_batches_per_sec / self.baseline_batches_per_sec if self.baseline_batches_per_sec else 1.0

    @property
    def ceiling_speedup(self) -> float:
        """Best measured throughput over the policy's starting point."""
        return self.best_batches_per_sec / self.baseline_batches_per_sec if self.baseline_batches_per_sec else 1.0

    def format(self) -> str:
        origin = "cache hit" if self.cached else f"searched in {self.search_seconds:.1f} s"
        lines = [
            f"DataPerf autotune ({origin}): num_workers={self.settings.num_workers}, "
            f"prefetch_factor={self.settings.prefetch_factor}, pin_memory={self.settings.pin_memory}, "
            f"persistent_workers={self.settings.persistent_workers}",
            f"  {self.chosen_batches_per_sec:.1f} batches/s, {self.speedup_over_start:.2f}x the policy's starting "
            f"point ({self.baseline_batches_per_sec:.1f}); best measured {self.best_batches_per_sec:.1f} "
            f"(ceiling speed-up over the start: {self.ceiling_speedup:.2f}x)",
            "  workers prefetch pin   batches/s  start-up s  memory MB  runs",
        ]
        for trial in self.trials:
            status = f"refused: {trial.refused}" if trial.refused else f"{trial.batches_per_sec:9.1f}"
            lines.append(
                f"  {trial.num_workers:7d} {trial.prefetch_factor!s:>8} {trial.pin_memory!s:5} {status:>11} "
                f"{trial.startup_s:10.2f} {trial.memory_mb:10.0f} {trial.measurements:5d}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["settings"]["reasons"] = dict(self.settings.reasons)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutotuneResult:
        data = dict(data)
        data["settings"] = LoaderSettings(**data["settings"])
        data["trials"] = tuple(Trial(**trial) for trial in data["trials"])
        return cls(**data)


def _neighbours(
    config: tuple[int, int | None, bool], min_workers: int, max_workers: int, cuda: bool
) -> dict[str, list[tuple]]:
    workers, prefetch, pin = config
    prefetch = prefetch or 2
    steps = {workers // 2, round(workers * 1.5), workers * 2, workers - 1, workers + 1, max_workers}
    worker_options = sorted({min(max_workers, value) for value in steps})
    worker_options = [value for value in worker_options if min_workers <= value and value != workers]
    options: dict[str, list[tuple]] = {"num_workers": [(value, prefetch, pin) for value in worker_options]}
    if workers:
        options["prefetch_factor"] = [
            (workers, value, pin) for value in (prefetch // 2, prefetch * 2) if 1 <= value <= 16
        ]
    if cuda:
        options["pin_memory"] = [(workers, prefetch, not pin)]
    return options


def autotune_loader(
    dataset: Dataset,
    batch_size: int,
    loader_kwargs: Mapping[str, Any] | None = None,
    *,
    hardware: Hardware | None = None,
    device: torch.device | str | None = None,
    time_budget: float = 30.0,
    batch_budget: int = 200,
    noise: float = 0.03,
    memory_fraction: float = 0.5,
    max_epochs: int | None = None,
    min_workers: int = 0,
    cache_path: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> AutotuneResult:
    """Search the fastest cheap DataLoader settings for ``dataset`` on this machine.

    Args:
        dataset: the real training dataset (map-style; read, never modified by the search).
        batch_size: the training batch size.
        loader_kwargs: your other DataLoader arguments (``collate_fn``, ``drop_last``, ...); any of
            ``num_workers``, ``prefetch_factor``, ``pin_memory`` given here are kept fixed.
        hardware: the probe to budget CPUs and memory by (per-rank CPUs under DDP).
        device: include the pinned host-to-device copy to this device (default: CUDA if available).
        time_budget: seconds for the whole search.
        batch_budget: most batches per trial.
        noise: relative throughput difference treated as equal.
        memory_fraction: refuse configurations whose ``/dev/shm`` plus pinned bytes exceed this
            fraction of what is free.
        max_epochs: planned epochs, for ``persistent_workers``.
        min_workers: fewest workers to consider. Loading in the main process (0) can deliver more
            batches/s to an idle consumer on a small machine, but it cannot overlap with a training
            step; ``TunedDataModule`` therefore searches from 1.
        cache_path: JSON cache (default :func:`default_cache_path`).
        force: search again even when the cache has an answer.
    """
    if time_budget <= 0 or batch_budget < 2:
        raise ValueError(
            f"autotune_loader(time_budget={time_budget}, batch_budget={batch_budget}): need a positive time budget "
            "and at least 2 batches per trial."
        )
    hardware = hardware or probe_hardware()
    loader_kwargs = dict(loader_kwargs or {})
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device) if device is not None else None
    device_name = "cpu" if device is None else device.type
    key = cache_key(hardware, dataset, batch_size, loader_kwargs, f"{device_name}|min_workers={min_workers}")
    path = Path(cache_path) if cache_path is not None else default_cache_path()
    if not force and (hit := _cached(path, key)) is not None:
        return dataclasses.replace(hit, cached=True)
    started = time.perf_counter()
    with rng_untouched(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")  # trying more is the point
        limits = Limits(time_budget, batch_budget, noise, memory_fraction, max_epochs, min_workers)
        result = _search(dataset, batch_size, loader_kwargs, hardware, device, limits)
    result = dataclasses.replace(result, search_seconds=time.perf_counter() - started, key=key)
    write_entry(path, key, result.to_dict())
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
    device: torch.device | None,
    limits: Limits,
) -> AutotuneResult:
    noise, min_workers, max_epochs = limits.noise, limits.min_workers, limits.max_epochs
    cuda = device is not None and device.type == "cuda"
    policy = recommend_loader_settings(hardware, max_epochs=max_epochs, accelerator=device.type if device else "cpu")
    fixed = {name: loader_kwargs.pop(name) for name in SEARCH_FIELDS if name in loader_kwargs}
    loader_kwargs.pop("persistent_workers", None)
    search = TrialRunner(dataset, batch_size, loader_kwargs, hardware, device, limits)
    max_workers = max(1, 2 * hardware.cpus_per_rank)  # beyond the cores only pays for I/O-latency-bound loading

    def respect_fixed(config: tuple) -> tuple:
        workers = fixed.get("num_workers", config[0])
        prefetch = fixed.get("prefetch_factor", config[1]) if workers else None
        return workers, prefetch, fixed.get("pin_memory", config[2])

    search.learn_batch_size()
    start_workers = max(min_workers, policy.num_workers)
    start = respect_fixed((start_workers, policy.prefetch_factor, policy.pin_memory and cuda))
    baseline = best = search.measure(*search.affordable(start))
    while search.climb_remaining > 0:
        gains = {}
        for knob, candidates in _neighbours(best.config, min_workers, max_workers, cuda).items():
            if knob in fixed:
                continue
            for candidate in candidates:
                if search.climb_remaining <= 0:
                    break
                trial = search.measure(*respect_fixed(candidate))
                if trial.refused is None and trial.batches_per_sec > gains.get(knob, best).batches_per_sec:
                    gains[knob] = trial
        if not gains:
            break
        winner = max(gains.values(), key=lambda trial: trial.batches_per_sec)
        if winner.batches_per_sec <= best.batches_per_sec * (1 + noise):
            break
        best = winner
    search.confirm()
    baseline = search.trials[baseline.config]
    measured = [trial for trial in search.trials.values() if trial.refused is None and trial.batches > 1]
    top = max(trial.batches_per_sec for trial in measured) if measured else 0.0
    cheapest = cheapest_near(measured, 1 - noise) or baseline
    settings = _settings_from(cheapest, policy, max_epochs)
    return AutotuneResult(
        settings=settings,
        trials=tuple(search.trials.values()),
        search_seconds=0.0,
        baseline_batches_per_sec=baseline.batches_per_sec,
        best_batches_per_sec=top,
        chosen_batches_per_sec=cheapest.batches_per_sec,
    )


def _settings_from(trial: Trial, policy: LoaderSettings, max_epochs: int | None) -> LoaderSettings:
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
