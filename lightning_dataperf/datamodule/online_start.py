"""Where the online loop starts: its tuner set on the training loader, from the setting a previous run kept on this
machine and loader, or why it is off."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from lightning_dataperf.autotune.online import OnlineResult, Setting, SettingSpace, refusal
from lightning_dataperf.autotune.online.saved import ConfirmSpace, SavedKey, load_saved, save_setting
from lightning_dataperf.datamodule.online import OnlineTuner, make_online
from lightning_dataperf.datamodule.online_ddp import RankSync, sync_every
from lightning_dataperf.datamodule.threads import set_threads
from lightning_dataperf.loader.policy import rank_workers
from lightning_dataperf.loader.seeding import number_batches, seed_batches_in_main_process
from lightning_dataperf.telemetry.hardware import Hardware

__all__ = ["attach_online", "loader_words", "machine_words", "online_off", "saved_root", "saved_setting", "saver"]


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


def attach_online(
    loader: DataLoader,
    trainer: Any,
    cpus: int,
    notes: list[str],
    seeding: tuple[int, int],
    options: dict[str, Any] | None = None,
    machine: str = "",
    gpu_share: float | None = None,
    persistent: bool = False,
) -> OnlineTuner | None:
    """The tuner for the training ``loader``, or ``None`` with the reason in ``notes`` where the loop cannot run.

    ``options``: :class:`OnlineTuner`'s ``precision``, ``max_batches`` (per trial) and ``max_cost`` (share of the run).
    ``cpus``: this rank's share of the host's cores. ``machine``: the host in words, with ``trainer.world_size``
    and the loader the key of the setting saved for the next run (``""``: none saved or read). ``gpu_share``: a
    split-decode loader's share of GPU decode, tried by the loop (``None``: no split decode). ``persistent``: the
    workers kept across epochs whatever count the loop moves to (the plan's ``persistent_workers``).
    """
    sampler = loader.sampler
    refused = refusal(trainer.world_size, trainer.fast_dev_run, trainer.overfit_batches)
    if refused:
        notes.append(f"online tuning off: {refused}; the loader keeps the settings above")
        return None
    device = trainer.strategy.root_device.type
    side_stream = "SideStream" in type(trainer.strategy).__name__
    threads = torch.get_num_threads()
    user = Setting(loader.num_workers, loader.prefetch_factor, loader.pin_memory, threads, gpu_share, persistent)
    # the user's own worker_init_fn (TunedDataModule's keeps it as user_init) runs only in workers: never 0 of them
    user_init = getattr(loader.worker_init_fn, "user_init", loader.worker_init_fn)
    space = SettingSpace(
        max_workers=max(2 * cpus, loader.num_workers),
        cpus=cpus,
        tune_threads=device == "cpu",
        tune_pinning=device == "cuda" and not side_stream,
        min_workers=1 if user_init is not None and loader.num_workers else 0,
        tune_share=gpu_share is not None,
        # the policy's count for the GPU run split decode is made for
        decode_workers=rank_workers(cpus, "cuda") if gpu_share is not None else 0,
    )
    key = SavedKey(machine, trainer.world_size, loader_words(loader)) if machine else None
    saved, said = saved_setting(trainer, key)
    start = saved or user
    ranks = trainer.world_size > 1
    every = sync_every(int((options or {}).get("max_batches", 200)))
    sync = RankSync(trainer.strategy, max(1, int(trainer.num_devices)), every) if ranks else None
    space = space if saved is None else ConfirmSpace.around(space, user)
    tuner = OnlineTuner(trainer, start, space, position=sampler.position, **(options or {}))
    if sync is not None:
        tuner.distribute(sync)
    if key is not None and trainer.global_rank == 0:
        tuner.on_decided = saver(saved_root(trainer), key)
    if saved is not None:
        # the loader starts at the saved setting: its first iterator is made after this
        loader.num_workers, loader.prefetch_factor = saved.num_workers, saved.prefetch_factor
        loader.pin_memory = saved.pin_memory
        set_threads(saved.threads)
    sampler.position = tuner.position
    # every batch is drawn from batch_seed(seed, epoch, rank, batch), in a worker or in this process alike
    numbered = number_batches(loader)
    seed_batches_in_main_process(loader, *seeding, tuner.position, fetched=tuner.loop.fetched)
    make_online(loader, tuner)
    notes.append(
        "online tuning: these settings are the start; neighbouring settings are tried on the training steps"
        " and the fastest kept (same samples in the same order; the result in TunedDataModule.online_result)"
        + ("; each batch's random draws are keyed by its number, whatever the workers" if numbered else "")
        + ("; never fewer than 1 worker: your worker_init_fn runs only in workers" if space.min_workers else "")
    )
    if ranks:
        notes.append(
            f"online tuning under DDP: rank zero decides for all {trainer.world_size} ranks, each switching at the"
            f" same batch (sync points every {every} batches while it searches); each rank's data wait gathered"
        )
    if said:
        notes.append(f"online tuning: {said}" + (f" ({saved.describe()})" if saved is not None else ""))
    return tuner
