"""How ``TunedDataModule`` tunes its training loader: :class:`OnlineTuning` or :class:`SearchTuning` (torch-free)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_dataperf._records import check, is_count, is_number, named_keys
from lightning_dataperf.autotune.progress import SearchProgress

__all__ = ["PROGRESS", "OnlineTuning", "SearchTuning"]

#: What ``progress`` may be besides a :class:`~lightning_dataperf.autotune.progress.SearchProgress`.
PROGRESS = ("auto", "bar", "log", "off", "none", True, False, None)


@named_keys
@dataclass(frozen=True, kw_only=True)
class OnlineTuning:
    """The online loop: from the policy's settings (or yours), neighbouring ones are tried on the run's own
    training steps and the fastest is kept; the samples and their order are unchanged.

    Args:
        precision: a trial ends once its rate's relative standard error is below this.
        max_batches: most training steps per trial (a trial also lasts at least ``min_seconds``).
        max_cost: most the slower trials may cost, as a share of the run's time at the rate of the setting in
            use (0.05: 5%); ``0`` measures the start and tries nothing else.
        min_seconds: shortest trial, in seconds (a shorter one reads the machine's moment, not the setting).
        max_seconds: longest trial, in seconds.

    Example::

        from lightning_dataperf import OnlineTuning, TunedDataModule

        datamodule = TunedDataModule.from_loaders(train_loader, autotune=OnlineTuning(max_cost=0.05))
        trainer.fit(model, datamodule=datamodule)
        print(datamodule.online_result.summary())
    """

    precision: float = 0.03
    max_batches: int = 200
    max_cost: float = 0.05
    min_seconds: float = 1.0
    max_seconds: float = 10.0

    def __post_init__(self) -> None:
        check(is_number(self.precision, 0, above=True), self, "precision", "give a relative error above 0, e.g. 0.03")
        check(is_count(self.max_batches, 1), self, "max_batches", "give a whole number of steps, at least 1")
        check(
            is_number(self.max_cost, 0),
            self,
            "max_cost",
            "give a share of the run of 0 or more, e.g. 0.05 for 5% (0: no trial beyond the start)",
        )
        check(is_number(self.min_seconds, 0), self, "min_seconds", "give seconds, 0 or more")
        check(is_number(self.max_seconds, 0, above=True), self, "max_seconds", "give seconds above 0")


@named_keys
@dataclass(frozen=True, kw_only=True)
class SearchTuning:
    """The measured search before fit: rank zero runs :func:`~lightning_dataperf.autotune.autotune_loader` on the
    training set along the Trainer's transfer path, and every rank trains with what it picked.

    Args:
        time_budget, batch_budget, noise, precision, choose_within, trial_seconds, memory_fraction, cache_path,
            force: as :func:`~lightning_dataperf.autotune.autotune_loader`'s.
        max_epochs: planned epochs, for ``persistent_workers``; ``None``: the Trainer's ``max_epochs``.
        min_workers: fewest workers to consider; ``None``: 1 (training keeps the main process busy), or 0 where a
            step is modelled (``step_seconds``, ``host_step_seconds`` or ``step_fn``).
        progress: ``"auto"`` follows the Trainer (a bar with its progress bar, log lines without); ``"bar"``,
            ``"log"``, ``False`` (silent) or a :class:`~lightning_dataperf.autotune.progress.SearchProgress`.
        step_seconds, host_step_seconds, step_fn, device_transform, side_stream: the step the trials model, as
            :func:`~lightning_dataperf.autotune.autotune_loader`'s; the Trainer's side-stream strategy, where it
            has one, gives the copy and the device transform instead.

    Example::

        from lightning_dataperf import SearchTuning, TunedDataModule

        datamodule = TunedDataModule.from_loaders(train_loader, autotune=SearchTuning(time_budget=20))
        trainer.fit(model, datamodule=datamodule)
        print(datamodule.autotune_result.format())
    """

    time_budget: float = 30.0
    batch_budget: int = 400
    noise: float = 0.03
    precision: float = 0.03
    choose_within: float = 0.02
    trial_seconds: float | None = None
    memory_fraction: float = 0.5
    max_epochs: int | None = None
    min_workers: int | None = None
    cache_path: str | os.PathLike[str] | None = None
    force: bool = False
    progress: Any = "auto"
    step_seconds: float = 0.0
    host_step_seconds: float = 0.0
    step_fn: Callable[[Any], Any] | None = None
    device_transform: Callable[[Any], Any] | None = None
    side_stream: bool = False

    def __post_init__(self) -> None:
        check(is_number(self.time_budget, 0, above=True), self, "time_budget", "give seconds above 0, e.g. 20")
        check(is_count(self.batch_budget, 2), self, "batch_budget", "give a whole number of batches, at least 2")
        check(is_number(self.noise, 0), self, "noise", "give a relative gain of 0 or more, e.g. 0.03")
        check(is_number(self.precision, 0, above=True), self, "precision", "give a relative error above 0, e.g. 0.03")
        check(is_number(self.choose_within, 0), self, "choose_within", "give a share of 0 or more, e.g. 0.02")
        seconds = self.trial_seconds
        check(seconds is None or is_number(seconds, 0, above=True), self, "trial_seconds", "give seconds above 0")
        fraction = self.memory_fraction
        check(is_number(fraction, 0, above=True) and fraction <= 1, self, "memory_fraction", "give a share in (0, 1]")
        check(self.max_epochs is None or is_count(self.max_epochs, -1), self, "max_epochs", "give a whole number")
        check(self.min_workers is None or is_count(self.min_workers, 0), self, "min_workers", "give 0 or more")
        cache = self.cache_path
        check(cache is None or isinstance(cache, (str, os.PathLike)), self, "cache_path", "give a file path")
        check(isinstance(self.force, bool), self, "force", "give True or False")
        progress = self.progress
        check(
            isinstance(progress, SearchProgress) or any(progress is c or progress == c for c in PROGRESS),
            self,
            "progress",
            f"give one of {', '.join(map(repr, PROGRESS))} or a SearchProgress",
        )
        for name in ("step_seconds", "host_step_seconds"):
            value = getattr(self, name)
            check(is_number(value, 0) and math.isfinite(value), self, name, "give seconds, 0 or more")
        check(self.step_fn is None or callable(self.step_fn), self, "step_fn", "give a function of the device batch")
        transform = self.device_transform
        check(transform is None or callable(transform), self, "device_transform", "give a function of the batch")
        check(isinstance(self.side_stream, bool), self, "side_stream", "give True or False")

    @property
    def models_a_step(self) -> bool:
        """A step is modelled (the trials run it after each batch), so loading in the main process can be tried."""
        return bool(self.step_seconds or self.host_step_seconds or self.step_fn)
