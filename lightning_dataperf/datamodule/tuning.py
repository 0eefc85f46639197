"""Autotune inside a Lightning run: rank zero searches for a TunedDataModule's training loader, the rest receive it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_dataperf import tags
from lightning_dataperf._records import keywords
from lightning_dataperf.autotune.consumer import TransferPath
from lightning_dataperf.autotune.options import SearchTuning
from lightning_dataperf.autotune.tune import AutotuneResult, autotune_loader, not_map_style
from lightning_dataperf.loader.policy import iterable_workers

__all__ = ["autotune_for_datamodule", "search_for_datamodule", "transfer_path_of"]

#: :class:`SearchTuning`'s fields that describe the transfer path (:func:`transfer_path_of`), not the search.
_PATH_FIELDS = ("step_seconds", "host_step_seconds", "step_fn", "device_transform", "side_stream")


def transfer_path_of(trainer: Any, tuning: SearchTuning) -> TransferPath:
    """The path the Trainer's batches take: its device, stock copy or side stream, and the modelled step."""
    from lightning_dataperf.transfer.strategies import SideStreamTransferMixin

    strategy = trainer.strategy if trainer is not None else None
    device = None
    if strategy is not None and strategy.root_device.type == "cuda":
        device = strategy.root_device
    elif trainer is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    side = isinstance(strategy, SideStreamTransferMixin) and strategy.side_stream_active
    step = dict(step_seconds=tuning.step_seconds, host_step_seconds=tuning.host_step_seconds, step_fn=tuning.step_fn)
    if side:
        return TransferPath(
            device=device,
            side_stream=True,
            pin_in_main=strategy.pin,
            min_bytes=strategy.min_bytes,
            device_transform=strategy.device_transform,
            **step,
        )
    return TransferPath(device=device, side_stream=tuning.side_stream, device_transform=tuning.device_transform, **step)


def _progress_of(trainer: Any, progress: Any) -> Any:
    # "auto" in a run follows the Trainer: its bar shows, so does the search's
    if progress != "auto" or trainer is None:
        return progress
    return "bar" if getattr(trainer, "progress_bar_callback", None) is not None else "log"


def autotune_for_datamodule(module: Any, explicit: Mapping[str, Any]) -> AutotuneResult:
    """Run the search for a TunedDataModule's training loader; rank zero searches, the others receive it.

    ``module.autotune`` is its :class:`~lightning_dataperf.autotune.options.SearchTuning`. The trials take the
    path the Trainer's batches will take (:func:`transfer_path_of`); progress, and where the result is shown,
    are in docs/datamodule.md (section 3).

    Example::

        class Data(TunedDataModule):
            ...
        Trainer(...).fit(model, datamodule=Data(autotune=SearchTuning()))   # calls autotune_for_datamodule once
    """
    tuning: SearchTuning = module.autotune
    trainer = getattr(module, "trainer", None)
    loader_kwargs = {key: value for key, value in explicit.items() if key not in {"dataset", "batch_size"}}
    options = {name: value for name, value in keywords(tuning).items() if name not in _PATH_FIELDS}
    # Without a modelled step the trials would reward loading in the main process, which training keeps busy.
    if tuning.min_workers is None:
        options["min_workers"] = 0 if tuning.models_a_step else 1
    if tuning.max_epochs is None and trainer is not None:
        options["max_epochs"] = trainer.max_epochs
    path = transfer_path_of(trainer, tuning)
    options["progress"] = _progress_of(trainer, tuning.progress)
    result = None
    if trainer is None or trainer.is_global_zero:
        result = autotune_loader(
            explicit["dataset"],
            explicit.get("batch_size", 1) or 1,
            loader_kwargs,
            hardware=module.hardware,
            path=path,
            **options,
        )
    if trainer is not None and trainer.world_size > 1:
        result = trainer.strategy.broadcast(result, src=0)
    assert result is not None
    if trainer is None or trainer.is_global_zero:
        if options["progress"] not in (False, None, "off", "none"):
            print(result.format(), flush=True)
        for logger in trainer.loggers if trainer is not None else []:
            logger.log_hyperparams(
                {
                    "dataperf/autotune_batches_per_sec": result.chosen_batches_per_sec,
                    "dataperf/autotune_ceiling_speedup": result.ceiling_speedup,
                    "dataperf/autotune_search_s": result.search_seconds,
                    "dataperf/autotune_trials": len(result.trials),
                    "dataperf/autotune_stop_reason": result.stop_reason,
                    "dataperf/autotune_cached": result.cached,
                }
            )
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text(tags.AUTOTUNE_TEXT, f"```\n{result.format()}\n```")
    return result


def search_for_datamodule(module: Any, explicit: Mapping[str, Any]) -> AutotuneResult | None:
    """:func:`autotune_for_datamodule`, or ``None`` with a warning where the dataset cannot be searched (the policy's
    settings stay)."""
    if (problem := not_map_style(dataset := explicit.get("dataset"))) is not None:
        settings = module.loader_settings
        # the plan's count: one worker over a stream, whatever the policy's
        workers = 1 if iterable_workers(dataset, settings.num_workers) else settings.num_workers
        rank_zero_warn(
            f"TunedDataModule(autotune=SearchTuning(...)): {problem} Training goes on with the policy's settings "
            f"(num_workers={workers}, prefetch_factor={settings.prefetch_factor}, "
            f"pin_memory={settings.pin_memory}).",
            category=UserWarning,
        )
        return None
    return autotune_for_datamodule(module, explicit)
