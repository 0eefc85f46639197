"""How :class:`~lightning_dataperf.datamodule.datamodule.TunedDataModule` takes part in your hooks without your help."""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from lightning.pytorch import LightningDataModule
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
    default_convert,
)

from lightning_dataperf._lightning_hooks import recorded_loader_arguments, reinit_loader
from lightning_dataperf.loader.settings import LoaderPlan
from lightning_dataperf.tags import Stage

__all__ = ["LOADER_HOOKS", "LoaderPlanner", "TunedHooks", "explicit_arguments", "reclaims_itself", "wrap_hooks"]

#: The DataModule hooks that build loaders, per stage.
LOADER_HOOKS = {f"{stage.value}_dataloader": stage.value for stage in Stage}
_INSIDE_HOOK = threading.local()
#: Loaders a hook returned and the module planned: returned again (a cached loader), they are left as they are.
_PLANNED: weakref.WeakSet[DataLoader] = weakref.WeakSet()


class LoaderPlanner(Protocol):
    """What a wrapped hook asks of its DataModule (``TunedDataModule`` is one)."""

    def plan_loader(self, stage: str, explicit: dict[str, Any]) -> tuple[LoaderPlan, dict[str, Any]]:
        """The plan for a loader built with the ``explicit`` arguments, and the arguments it changes."""
        ...

    def finish_loader(self, stage: str, loader: DataLoader, plan: LoaderPlan) -> None:
        """After the loader was built with the plan's arguments (sampler state, seeding, the online loop)."""
        ...

    def decode_on_gpu(self, result: Any, plans: list[LoaderPlan]) -> Any:
        """The hook's result as training receives it (``gpu_decode``: wrapped)."""
        ...

    def report_plans(self, stage: str, plans: list[LoaderPlan]) -> None:
        """Keep and print what was planned for the stage's loaders."""
        ...

    def reclaim_sharing(self) -> None:
        """Remove what its loaders' workers sent by file name and nobody received."""
        ...


def wrap_hooks(cls: type[LoaderPlanner]) -> None:
    """Wrap ``cls``'s own loader hooks (:func:`_tuned`) and ``teardown`` (:func:`_reclaiming`), once each.

    A wrapped ``*_dataloader`` runs yours, then each ``DataLoader`` it returns (alone, in a list, a dict or a
    ``CombinedLoader``) gets the module's plan for the arguments you did not pass; after your ``teardown``, what
    the loaders' workers sent by file name and nobody received leaves ``/dev/shm``.

    Example::

        class MyData(TunedDataModule):        # wrap_hooks(MyData) runs at class creation
            def train_dataloader(self):
                return DataLoader(self.train_set, batch_size=64)
    """
    for name, stage in LOADER_HOOKS.items():
        hook = getattr(cls, name, None)  # as resolved: a mixin's before TunedDataModule's counts too
        own = callable(hook) and hook is not getattr(LightningDataModule, name)
        if own and not getattr(hook, "_dataperf_tuned", False):
            setattr(cls, name, _tuned(hook, stage))
    teardown = getattr(cls, "teardown", None)  # as resolved: a mixin's before TunedDataModule's counts too
    if callable(teardown) and not getattr(teardown, "_dataperf_reclaims", False):
        cls.teardown = _reclaiming(teardown)  # type: ignore[attr-defined]


class TunedHooks:
    """Mixin: a subclass's own loader hooks and ``teardown`` are wrapped when it is created (:func:`wrap_hooks`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        wrap_hooks(cls)  # type: ignore[arg-type]


def reclaims_itself(teardown: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``teardown`` that calls ``reclaim_sharing`` itself: :func:`wrap_hooks` leaves it as it is."""
    teardown._dataperf_reclaims = True  # type: ignore[attr-defined]
    return teardown


def explicit_arguments(loader: DataLoader) -> dict[str, Any]:
    """The arguments you built ``loader`` with: as Lightning recorded them under a Trainer, else those whose value is
    not ``DataLoader``'s default (a default you passed yourself is then the policy's to fill)."""
    recorded = recorded_loader_arguments(loader)
    if recorded is not None:
        extra = recorded.pop("kwargs", {})
        return {**recorded, **extra}
    state = _arguments_as_built(loader)
    automatic = default_collate if loader.batch_size is not None else default_convert
    defaults = {**_DEFAULTS, "collate_fn": automatic, "sampler": None}
    # workers' prefetch_factor=2 is PyTorch's own when none is given: not told apart from yours
    defaults["prefetch_factor"] = 2 if loader.num_workers else None
    explicit = {name: value for name, value in state.items() if name not in defaults or value != defaults[name]}
    sampler = explicit.pop("sampler", None)
    if isinstance(sampler, RandomSampler) and sampler.generator is loader.generator and not sampler.replacement:
        explicit["shuffle"] = True
    elif sampler is not None and not isinstance(sampler, SequentialSampler):
        explicit["sampler"] = sampler
    return {"dataset": loader.dataset, **explicit}


_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(DataLoader.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}


def _arguments_as_built(loader: DataLoader) -> dict[str, Any]:
    """Every argument that builds ``loader`` again as it is now (its own sampler objects kept)."""
    arguments: dict[str, Any] = {
        "dataset": loader.dataset,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if hasattr(loader, "in_order"):
        arguments["in_order"] = loader.in_order
    batches = loader.batch_sampler
    # one DataLoader made from batch_size wraps the loader's own sampler; yours wraps another
    if batches is not None and not (type(batches) is BatchSampler and batches.sampler is loader.sampler):
        return {**arguments, "batch_sampler": batches}
    arguments.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    if not isinstance(loader.dataset, IterableDataset):
        arguments["sampler"] = loader.sampler
    return arguments


def _reclaiming(teardown: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(teardown)
    def reclaiming_teardown(self: LoaderPlanner, *args: Any, **kwargs: Any) -> Any:
        try:
            return teardown(self, *args, **kwargs)
        finally:
            self.reclaim_sharing()

    reclaiming_teardown._dataperf_reclaims = True  # type: ignore[attr-defined]
    return reclaiming_teardown


def _tuned(hook: Callable[..., Any], stage: str) -> Callable[..., Any]:
    @functools.wraps(hook)
    def tuned_hook(self: LoaderPlanner, *args: Any, **kwargs: Any) -> Any:
        # a hook that calls another (or super's): the outermost plans what comes back
        if getattr(_INSIDE_HOOK, "active", False):
            return hook(self, *args, **kwargs)
        _INSIDE_HOOK.active = True
        try:
            result = hook(self, *args, **kwargs)
        finally:
            _INSIDE_HOOK.active = False
        plans = [_plan(self, stage, loader) for loader in _returned_loaders(result) if loader not in _PLANNED]
        result = self.decode_on_gpu(result, plans)
        self.report_plans(stage, plans)
        return result

    tuned_hook._dataperf_tuned = True  # type: ignore[attr-defined]
    return tuned_hook


def _plan(module: LoaderPlanner, stage: str, loader: DataLoader) -> LoaderPlan:
    """Build ``loader`` again, in place, with the module's plan for the arguments you did not pass."""
    explicit = explicit_arguments(loader)
    plan, updates = module.plan_loader(stage, explicit)
    final = {**_arguments_as_built(loader), **updates}
    # the plan's None (e.g. shuffle beside its own sampler): left out, not passed
    final = {name: value for name, value in final.items() if value is not None or name not in updates}
    if "sampler" in updates or "batch_sampler" in final:
        final.pop("shuffle", None)
    reinit_loader(loader, final)
    _PLANNED.add(loader)
    module.finish_loader(stage, loader, plan)
    return plan


def _returned_loaders(result: Any) -> Iterator[DataLoader]:
    """The DataLoaders in a hook's result, in order: alone, in a list, tuple or dict, or a ``CombinedLoader``'s."""
    if isinstance(result, DataLoader):
        yield result
    elif isinstance(result, Mapping):
        for value in result.values():
            yield from _returned_loaders(value)
    elif isinstance(result, (list, tuple)):
        for value in result:
            yield from _returned_loaders(value)
    elif type(result).__name__ == "CombinedLoader" and hasattr(result, "iterables"):
        yield from _returned_loaders(result.iterables)
