"""The arguments that build a DataLoader again, for a module that makes its loaders itself."""

from __future__ import annotations

import inspect
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

__all__ = ["loader_arguments"]

# arguments read back from how the loader batches and samples, not from an attribute of the same name.
_SAMPLING = frozenset({"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})
# passed even at their defaults, as before: the policy must not fill in what the user's loader already had
_ALWAYS = ("num_workers", "pin_memory", "collate_fn", "timeout", "worker_init_fn")
_WORKER_ONLY = ("prefetch_factor", "persistent_workers")
_PARAMETERS = {name: p for name, p in inspect.signature(DataLoader.__init__).parameters.items() if name != "self"}


def loader_arguments(loader: DataLoader) -> dict[str, Any]:
    """The arguments that build ``loader`` again: every argument of ``DataLoader.__init__``, read back from it.

    A plain ``BatchSampler`` you passed stays yours, an iterable dataset gets no sampler, a ``shuffle=True``
    sampler comes back as ``shuffle=True``; an argument left at its default is left out.

    Args:
        loader: the DataLoader to copy.

    Raises:
        TypeError: ``DataLoader.__init__`` has an argument this function cannot read back (a newer torch):
            it is not dropped silently.

    Example::

        again = DataLoader(**loader_arguments(loader))   # same batches, same workers, same context
    """
    arguments: dict[str, Any] = {"dataset": loader.dataset, **_sampling(loader)}
    for name, parameter in _PARAMETERS.items():
        if name in _SAMPLING or name == "dataset" or parameter.kind is parameter.VAR_KEYWORD:
            continue
        if not hasattr(loader, name):
            raise TypeError(
                f"DataLoader argument {name!r} cannot be read back from the loader, so "
                "TunedDataModule.from_loaders would drop it: build the loader in your own "
                "TunedDataModule.train_dataloader instead (and report this torch version)"
            )
        value = getattr(loader, name)
        if name in _WORKER_ONLY and not loader.num_workers:
            continue
        if name in _ALWAYS or name in _WORKER_ONLY or not _is_default(value, parameter.default):
            arguments[name] = value
    return arguments


def _sampling(loader: DataLoader) -> dict[str, Any]:
    """``batch_size``/``drop_last`` and the sampler, or the user's ``batch_sampler`` alone."""
    # a user batch_sampler leaves batch_size None; a batch_size=None loader has no batch_sampler
    if loader.batch_size is None and loader.batch_sampler is not None:
        return {"batch_sampler": loader.batch_sampler}
    arguments: dict[str, Any] = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    # the sampler of an iterable dataset is DataLoader's own (_InfiniteConstantSampler), which it refuses back
    if isinstance(loader.dataset, IterableDataset):
        return arguments
    sampler = loader.sampler
    if type(sampler) is SequentialSampler and sampler.data_source is loader.dataset:
        return arguments
    if (
        type(sampler) is RandomSampler
        and sampler.data_source is loader.dataset
        and not sampler.replacement
        and sampler.num_samples == len(loader.dataset)  # type: ignore[arg-type]
        and sampler.generator is loader.generator
    ):
        return {**arguments, "shuffle": True}
    return {**arguments, "sampler": sampler}


def _is_default(value: Any, default: Any) -> bool:
    return default is not inspect.Parameter.empty and type(value) is type(default) and value == default
