"""The outcome of an autotune search: the chosen settings, every trial, why the search stopped."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_dataperf.autotune.trial import Config, Trial
from lightning_dataperf.loader.settings import LoaderSettings

__all__ = ["AutotuneResult", "config_of"]

#: After the pick's rate where its only measurement was rough (no steady trial at all: a tiny dataset or budget).
ROUGH_PICK = " (rough: cut before one steady round)"


def config_of(settings: LoaderSettings) -> Config:
    """``(num_workers, prefetch_factor, pin_memory)`` of a setting, as trials are keyed."""
    workers = settings.num_workers
    return workers, settings.prefetch_factor if workers else None, settings.pin_memory


@dataclass(frozen=True)
class AutotuneResult:
    """The chosen settings, every trial, why the search stopped, and how long it took.

    ``search_seconds`` is the search's wall time (kept from the original search on a cache hit);
    ``elapsed_s`` what this call cost (search or cache lookup) and ``ended_at`` its end on
    ``time.perf_counter()``: subtract it from anything timed across the call (the first epoch's start-up).
    ``stop_reason`` names what ended the worker climb: ``"gain"`` (more workers gave nothing),
    ``"fewer"`` (fewer workers were as fast), ``"path"`` (the training path, not the loader, was the limit:
    the main thread hardly waited for batches), ``"CPUs"`` (the cost model: the CPUs left by the main thread
    cannot make more batches than measured), one of :meth:`TrialRunner.worker_bounds`'s names
    (``"/dev/shm"``, ``"memory"``, ``"file descriptors"``, ``"CPU share"``, ``"dataset"``),
    ``"memory guard"``, ``"time budget"`` or ``"fixed"`` (you set ``num_workers``); ``stop_detail`` says it
    with numbers and ``bounds`` holds every bound's worker count at the chosen prefetch. ``sharing_strategy``
    is ``"file_system"`` when the chosen trial's workers sent their batches that way (the search adopted it,
    faster beyond noise; pass
    ``worker_init_fn=ShareBy("file_system")``; :class:`~lightning_dataperf.datamodule.datamodule.TunedDataModule` does),
    ``None`` otherwise; ``sharing_detail`` says what was measured.

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
    batch_size: int = 0
    stop_reason: str = ""
    stop_detail: str = ""
    bounds: dict[str, int] = field(default_factory=dict)
    transfer: str = ""
    elapsed_s: float = 0.0
    ended_at: float = 0.0
    sharing_strategy: str | None = None
    sharing_detail: str = ""

    @property
    def speedup_over_start(self) -> float:
        """Chosen throughput over the policy's starting point."""
        return self.chosen_batches_per_sec / self.baseline_batches_per_sec if self.baseline_batches_per_sec else 1.0

    @property
    def ceiling_speedup(self) -> float:
        """Best measured throughput over the policy's starting point."""
        return self.best_batches_per_sec / self.baseline_batches_per_sec if self.baseline_batches_per_sec else 1.0

    @property
    def chosen_samples_per_sec(self) -> float:
        return self.chosen_batches_per_sec * max(1, self.batch_size)

    @property
    def chosen_trial(self) -> Trial | None:
        config = config_of(self.settings)
        return next((trial for trial in self.trials if trial.measured_as == (config, self.sharing_strategy)), None)

    @property
    def _rough_pick(self) -> str:
        """:data:`ROUGH_PICK` where the pick's only measurement was rough, else nothing."""
        chosen = self.chosen_trial
        return ROUGH_PICK if chosen is not None and chosen.rough else ""

    @property
    def trial_seconds(self) -> float:
        """Time spent in trials (the rest of ``search_seconds`` is set-up and bookkeeping)."""
        return sum(trial.seconds for trial in self.trials)

    def summary_line(self) -> str:
        """One line for a verdict to quote, e.g. ``autotune measured 16 workers (prefetch 2, pinned) at
        3,810 samples/s; more gave nothing (24 workers: -1%)``."""
        settings = self.settings
        pin = "pinned" if settings.pin_memory else "not pinned"
        prefetch = f"prefetch {settings.prefetch_factor}, " if settings.num_workers else ""
        rate = (
            f"{self.chosen_samples_per_sec:,.0f} samples/s"
            if self.batch_size
            else f"{self.chosen_batches_per_sec:,.1f} batches/s"
        )
        origin = " (in an earlier run, from the cache)" if self.cached else ""
        rate += self._rough_pick
        line = f"autotune{origin} measured {settings.num_workers} workers ({prefetch}{pin}) at {rate}"
        line = f"{line}; {self.stop_detail}" if self.stop_detail else line
        return f"{line}; {self.sharing_detail}" if self.sharing_strategy else line

    def format(self) -> str:
        origin = "cache hit" if self.cached else f"searched in {self.search_seconds:.1f} s"
        lines = [
            f"DataPerf autotune ({origin}, {len(self.trials)} trials, {self.trial_seconds:.1f} s in trials"
            f"{', path ' + self.transfer if self.transfer else ''}): num_workers={self.settings.num_workers}, "
            f"prefetch_factor={self.settings.prefetch_factor}, pin_memory={self.settings.pin_memory}, "
            f"persistent_workers={self.settings.persistent_workers}",
            f"  {self.chosen_batches_per_sec:.1f} batches/s{self._rough_pick}, "
            f"{self.speedup_over_start:.2f}x the policy's starting "
            f"point ({self.baseline_batches_per_sec:.1f}); best measured {self.best_batches_per_sec:.1f} "
            f"(ceiling speed-up over the start: {self.ceiling_speedup:.2f}x)",
        ]
        if self.stop_detail:
            lines.append(f"  stopped: {self.stop_detail}")
        if self.sharing_detail:
            use = f": pass worker_init_fn=ShareBy({self.sharing_strategy!r})" if self.sharing_strategy else ""
            lines.append(f"  hand-over: {self.sharing_detail}{use}")
        lines.append("  workers prefetch pin   batches/s  start-up s  trial s  worker busy  memory MB  runs  sharing")
        chosen = self.chosen_trial
        for trial in self.trials:  # in the order measured (the policy's pick first)
            if trial.refused:
                status = f"refused: {trial.refused}"
            else:
                # a rough rate (cut before one steady round) is the start-up burst's: not ranked
                status = f"{trial.batches_per_sec:.0f} rough" if trial.rough else f"{trial.batches_per_sec:9.1f}"
            busy = "-" if trial.worker_busy is None else f"{100 * trial.worker_busy:.0f}%"
            lines.append(
                f"  {trial.num_workers:7d} {trial.prefetch_factor!s:>8} {trial.pin_memory!s:5} {status:>11} "
                f"{trial.startup_s:10.2f} {trial.seconds:8.1f} {busy:>12} {trial.memory_mb:10.0f} "
                f"{trial.measurements:5d}  {trial.sharing or '-'}" + ("  <- chosen" if trial is chosen else "")
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
        data["bounds"] = dict(data.get("bounds", {}))
        return cls(**data)
