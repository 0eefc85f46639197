"""Where the online loop starts: the setting a previous run kept on this machine and loader, or why it is off."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from lightning_dataperf.autotune.online import OnlineResult, Setting
from lightning_dataperf.autotune.online.saved import SavedKey, load_saved, save_setting
from lightning_dataperf.telemetry.hardware import Hardware

__all__ = ["loader_words", "machine_words", "online_off", "saved_root", "saved_setting", "saver"]


def saved_root(trainer: Any) -> str:
    """Where the kept setting is saved: the logger's folder of all versions (the log dir moves to a new version each
    run), else the trainer's ``default_root_dir``."""
    logger = trainer.logger
    root = getattr(logger, "root_dir", None) if logger is not None else None
    return str(root or trainer.default_root_dir)


def saved_setting(trainer: Any, key: SavedKey | None) -> tuple[Setting | None, str]:
    """The setting saved for ``key`` beside the run and the note, read on rank zero and sent to every rank."""
    found: tuple[Setting | None, str] = (None, "")
    if key is not None and trainer.global_rank == 0:
        found = load_saved(saved_root(trainer), key)
    return trainer.strategy.broadcast(found, src=0) if trainer.world_size > 1 else found


def saver(root: str, key: SavedKey) -> Callable[[Setting], None]:
    def save(setting: Setting) -> None:
        try:
            save_setting(root, key, setting)
        except OSError as error:  # a read-only root: the run goes on, the next one starts afresh
            rank_zero_warn(f"online tuning: the kept setting could not be saved in {root} ({error})")

    return save


def loader_words(loader: DataLoader) -> str:
    """The loader part of the saved setting's key: what it loads, in which batches, collated how."""
    dataset, collate = loader.dataset, loader.collate_fn
    try:
        length: object = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        length = "?"
    name = getattr(collate, "__qualname__", type(collate).__qualname__)
    return f"{type(dataset).__qualname__} len={length} batch_size={loader.batch_size} collate={name}"


def machine_words(hardware: Hardware) -> str:
    """The machine part of the saved setting's key: host name, CPU count, GPU names."""
    gpus = ",".join(gpu.name for gpu in hardware.gpus) or "none"
    return f"{socket.gethostname()} cpus={hardware.logical_cpus} gpus={gpus}"


def online_off(loader: DataLoader, notes: list[str]) -> OnlineResult:
    """Why the loop cannot run on ``loader`` (one without the package's resumable sampler): in ``notes``, and as
    the result's ``stop_reason`` (not a silent ``None``)."""
    if isinstance(loader.dataset, IterableDataset):
        what = "an IterableDataset has no batch positions to restart at"
    # a DataLoader given batch_size builds a plain BatchSampler over its own sampler; one given batch_sampler does not
    elif (batches := loader.batch_sampler) is not None and (
        type(batches) is not BatchSampler or getattr(batches, "sampler", None) is not loader.sampler
    ):
        what = "your batch_sampler cannot be restarted at a batch"
    else:
        what = "your sampler cannot be restarted at a batch with its order kept"
    reason = f"{what}, and the loop rebuilds the loader's iterator mid-epoch at the next unconsumed batch"
    notes.append(f"online tuning off: {reason}; the loader keeps the settings above")
    return OnlineResult(stop_reason=f"off: {reason}")
