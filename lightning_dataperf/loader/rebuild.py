"""The arguments that build a DataLoader again, for a module that makes its loaders itself."""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

__all__ = ["loader_arguments"]


def loader_arguments(loader: DataLoader) -> dict[str, Any]:
    """The arguments that build ``loader`` again (its sampler where it is not one ``shuffle`` makes)."""
    arguments: dict[str, Any] = {
        "dataset": loader.dataset,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
    }
    if loader.num_workers:
        arguments.update(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        return {**arguments, "batch_sampler": loader.batch_sampler}
    arguments.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    if isinstance(loader.sampler, RandomSampler):
        arguments["shuffle"] = True
    elif not isinstance(loader.sampler, SequentialSampler):
        arguments["sampler"] = loader.sampler
    return arguments
