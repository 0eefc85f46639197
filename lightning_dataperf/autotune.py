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

import contextlib
import dataclasses
import gc
import hashlib
import json
import os
import random
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.data import sized_len
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, Dataset, Sampler

from lightning_dataperf.hardware import Hardware, probe_hardware
from lightning_dataperf.policy import LoaderSettings, recommend_loader_settings
from lightning_dataperf.preflight import BatchFootprint, pinned_bytes
from lightning_dataperf.transfer import map_tensors

__all__ = ["AutotuneResult", "Trial", "autotune_loader", "default_cache_path"]

_MB = 2**20
SEARCH_FIELDS = ("num_workers", "prefetch_factor", "pin_memory")
CACHE_VERSION = 2
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


def default_cache_path() -> Path:
    """``$LIGHTNING_DATAPERF_CACHE`` or ``~/.cache/lightning_dataperf/autotune.json``."""
    if env := os.environ.get("LIGHTNING_DATAPERF_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lightning_dataperf" / "autotune.json"


def dataset_fingerprint(dataset: Any) -> str:
    """Type, length and simple attributes of the dataset (override with a ``dataperf_fingerprint()`` method)."""
    custom = getattr(dataset, "dataperf_fingerprint", None)
    if callable(custom):
        return str(custom())
    simple = {
        key: value
        for key, value in sorted(vars(dataset).items())
        if isinstance(value, (int, float, str, bool, tuple, type(None))) and not key.startswith("_")
    }
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    return f"{kind}|{sized_len(dataset)}|{simple!r}"


def cache_key(hardware: Hardware, dataset: Any, batch_size: int, loader_kwargs: Mapping[str, Any], device: str) -> str:
    collate = loader_kwargs.get("collate_fn")
    collate_name = (
        "default" if collate is None else f"{type(collate).__qualname__}:{getattr(collate, '__qualname__', '')}"
    )
    gpu = hardware.gpus[0].name if hardware.gpus else "none"
    parts = [
        f"v{CACHE_VERSION}",
        f"cpus={hardware.cpus_per_rank}",
        f"gpu={gpu}",
        f"device={device}",
        dataset_fingerprint(dataset),
        f"batch={batch_size}",
        f"collate={collate_name}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class _Limits:
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
def _rng_untouched() -> Iterator[None]:
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
    cheapest = _cheapest_near(ranked, band)
    if cheapest is not None and cheapest not in chosen:
        chosen.append(cheapest)
    return chosen


def _cheapest_near(trials: list[Trial], share: float) -> Trial | None:
    """The cheapest trial at least ``share`` times as fast as the fastest (``None`` without trials)."""
    if not trials:
        return None
    top = max(trial.batches_per_sec for trial in trials)
    return min((trial for trial in trials if trial.batches_per_sec >= share * top), key=lambda trial: trial.cost)


class _Search:
    """State of one search: budgets, the measured trials, the memory guard."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        loader_kwargs: Mapping[str, Any],
        hardware: Hardware,
        device: torch.device | None,
        limits: _Limits,
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
            _shutdown(iterator)
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


def _shutdown(iterator: Any) -> None:
    """Stop a DataLoader iterator's workers and pin thread now, not at garbage collection."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if callable(stop):
        stop()


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
    if not force and (hit := _read_cache(path, key)) is not None:
        return dataclasses.replace(hit, cached=True)
    started = time.perf_counter()
    with _rng_untouched(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")  # trying more is the point
        limits = _Limits(time_budget, batch_budget, noise, memory_fraction, max_epochs, min_workers)
        result = _search(dataset, batch_size, loader_kwargs, hardware, device, limits)
    result = dataclasses.replace(result, search_seconds=time.perf_counter() - started, key=key)
    _write_cache(path, key, result)
    return result


def _search(
    dataset: Dataset,
    batch_size: int,
    loader_kwargs: dict[str, Any],
    hardware: Hardware,
    device: torch.device | None,
    limits: _Limits,
) -> AutotuneResult:
    noise, min_workers, max_epochs = limits.noise, limits.min_workers, limits.max_epochs
    cuda = device is not None and device.type == "cuda"
    policy = recommend_loader_settings(hardware, max_epochs=max_epochs, accelerator=device.type if device else "cpu")
    fixed = {name: loader_kwargs.pop(name) for name in SEARCH_FIELDS if name in loader_kwargs}
    loader_kwargs.pop("persistent_workers", None)
    search = _Search(dataset, batch_size, loader_kwargs, hardware, device, limits)
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
    cheapest = _cheapest_near(measured, 1 - noise) or baseline
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


def _read_cache(path: Path, key: str) -> AutotuneResult | None:
    try:
        entries = json.loads(path.read_text())
        return AutotuneResult.from_dict(entries[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, key: str, result: AutotuneResult) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            entries = {}
        entries[key] = result.to_dict()
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.replace(path)
    except OSError:
        pass  # a read-only home must not stop training; the next run searches again


def autotune_for_datamodule(module: Any, explicit: Mapping[str, Any]) -> AutotuneResult:
    """Run the search for a TunedDataModule's training loader; rank zero searches, the others receive it."""
    options = dict(module.autotune_options)
    trainer = getattr(module, "trainer", None)
    loader_kwargs = {key: value for key, value in explicit.items() if key not in {"dataset", "batch_size"}}
    device = None
    options.setdefault("min_workers", 1)  # the main process will be busy training
    if trainer is not None:
        device = trainer.strategy.root_device if trainer.strategy.root_device.type == "cuda" else torch.device("cpu")
        options.setdefault("max_epochs", trainer.max_epochs)
    result = None
    if trainer is None or trainer.is_global_zero:
        result = autotune_loader(
            explicit["dataset"],
            explicit.get("batch_size", 1) or 1,
            loader_kwargs,
            hardware=module.hardware,
            device=device,
            **options,
        )
    if trainer is not None and trainer.world_size > 1:
        result = trainer.strategy.broadcast(result, src=0)
    assert result is not None
    if trainer is None or trainer.is_global_zero:
        print(result.format(), flush=True)
        for logger in trainer.loggers if trainer is not None else []:
            logger.log_hyperparams(
                {
                    "dataperf/autotune_batches_per_sec": result.chosen_batches_per_sec,
                    "dataperf/autotune_ceiling_speedup": result.ceiling_speedup,
                }
            )
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("DataPerf/autotune", f"```\n{result.format()}\n```")
    return result
