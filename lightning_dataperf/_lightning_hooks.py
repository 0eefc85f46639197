"""The one place where lightning_dataperf touches private Lightning API.

Lightning's data fetcher brackets exactly the loader's ``next()`` with two callables,
``data_fetcher._start_profiler`` / ``_stop_profiler``, which every loop points at its own
``_on_before_fetch`` / ``_on_after_fetch`` methods at the start of each run (see
``lightning/pytorch/loops/fetchers.py`` and ``training_epoch_loop.py``). We shadow those two methods
with instance attributes that call the original first and then our timer, and remove them again at
teardown. ``tests/test_lightning_hooks.py`` fails loudly if a Lightning release changes this.

:func:`resume_position` reads the fit loop's progress counters (``epoch_progress``,
``batch_progress``, ``restarting``) so that samplers can produce the order an uninterrupted run
would have; ``tests/test_datamodule.py`` checks the resumed order end to end.

:func:`tensorboard_prefixed` applies a ``TensorBoardLogger``'s ``prefix`` the way its
``log_metrics`` does, for the one-event TensorBoard writer in ``loggers.py``;
``tests/test_loggers.py`` checks the tags against ``log_metrics``' own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import TensorBoardLogger

__all__ = [
    "FETCH_HOOKS",
    "FetchHooks",
    "check_lightning_compatibility",
    "loops_by_stage",
    "resume_position",
    "tensorboard_prefixed",
]

FETCH_HOOKS = ("_on_before_fetch", "_on_after_fetch")

FetchCallback = Callable[[str], None]


def loops_by_stage(trainer: pl.Trainer) -> dict[str, Any]:
    """The loops that fetch batches, keyed by the stage name used as a metric prefix."""
    return {
        "train": trainer.fit_loop.epoch_loop,
        "val": trainer.fit_loop.epoch_loop.val_loop,
        "validate": trainer.validate_loop,
        "test": trainer.test_loop,
        "predict": trainer.predict_loop,
    }


def resume_position(trainer: pl.Trainer) -> tuple[int, int]:
    """``(epoch, batches already trained in it)`` for the training iterator being created now.

    Lightning creates the first training iterator of a fit before it calls the sampler's
    ``set_epoch``; at that moment the restored loop counters already hold the epoch, and when it
    restarts mid-epoch, how many batches of it were completed. A checkpoint taken at the end of an
    epoch has ``processed`` already counting that epoch, so the next epoch starts from zero.
    """
    fit_loop = trainer.fit_loop
    progress = fit_loop.epoch_progress.current
    epoch = int(progress.processed)
    mid_epoch = progress.ready != progress.processed or progress.started != progress.processed
    if not (fit_loop.restarting and mid_epoch):
        return epoch, 0
    batches = fit_loop.epoch_loop.batch_progress
    if batches.is_last_batch:
        return epoch + 1, 0
    return epoch, int(batches.current.processed)


def tensorboard_prefixed(logger: TensorBoardLogger, metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` with the tags ``logger.log_metrics`` would write (its ``prefix`` joined on)."""
    prefix = logger._prefix
    if not prefix:
        return dict(metrics)
    return {f"{prefix}{logger.LOGGER_JOIN_CHAR}{tag}": value for tag, value in metrics.items()}


def check_lightning_compatibility(trainer: pl.Trainer) -> None:
    """Raise a clear error if the private fetch hooks are gone from this Lightning version."""
    missing = [
        f"{type(loop).__name__}.{name}"
        for loop in loops_by_stage(trainer).values()
        for name in FETCH_HOOKS
        if not callable(getattr(loop, name, None))
    ]
    if missing:
        raise RuntimeError(
            f"lightning_dataperf cannot time batch fetches with lightning {pl.__version__}: "
            f"{', '.join(missing)} no longer exist. Pin lightning to a version listed in the "
            "lightning_dataperf README, or report this at the project's issue tracker."
        )


@dataclass
class FetchHooks:
    """Installs ``before(stage)`` / ``after(stage)`` around every loop's batch fetch.

    ``after`` runs even when ``next()`` raises ``StopIteration`` (Lightning's fetcher calls its stop
    hook in a ``finally``), so callers must tolerate an ``after`` without a batch.
    """

    before: FetchCallback
    after: FetchCallback
    _installed: list[tuple[Any, str]] = field(default_factory=list)

    def install(self, trainer: pl.Trainer) -> None:
        check_lightning_compatibility(trainer)
        self.uninstall()
        for stage, loop in loops_by_stage(trainer).items():
            original_before = loop._on_before_fetch
            original_after = loop._on_after_fetch
            loop._on_before_fetch = self._chain(original_before, self.before, stage, ours_last=True)
            loop._on_after_fetch = self._chain(original_after, self.after, stage, ours_last=False)
            self._installed.append((loop, stage))

    def uninstall(self) -> None:
        for loop, _ in self._installed:
            for name in FETCH_HOOKS:
                loop.__dict__.pop(name, None)
        self._installed.clear()

    @property
    def installed(self) -> bool:
        return bool(self._installed)

    @staticmethod
    def _chain(original: Callable[[], None], ours: FetchCallback, stage: str, ours_last: bool) -> Callable[[], None]:
        # Our timer sits innermost, so the profiler's own bookkeeping is not counted as data wait.
        def before_then_ours() -> None:
            original()
            ours(stage)

        def ours_then_after() -> None:
            ours(stage)
            original()

        return before_then_ours if ours_last else ours_then_after
