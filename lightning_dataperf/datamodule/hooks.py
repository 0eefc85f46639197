"""How :class:`~lightning_dataperf.datamodule.datamodule.TunedDataModule` takes part in your hooks without your help."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from lightning_dataperf.loader.settings import LoaderPlan
from lightning_dataperf.tags import Stage

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule

__all__ = ["LOADER_HOOKS", "loaders_built_as_they_are", "reclaim_sharing", "tuning_new_loaders", "wrap_hooks"]

#: The DataModule hooks that build loaders, per stage.
LOADER_HOOKS = {f"{stage.value}_dataloader": stage.value for stage in Stage}
_INSIDE_HOOK = threading.local()
_DATALOADER_SIGNATURE = inspect.signature(DataLoader.__init__)


def wrap_hooks(cls: type[LightningDataModule]) -> None:
    """Wrap ``cls``'s own loader hooks (:func:`_tuned`) and ``teardown`` (:func:`_reclaiming`), once each.

    While a wrapped ``*_dataloader`` runs, every ``DataLoader`` it constructs gets the module's plan for the
    arguments you did not pass (:func:`tuning_new_loaders`); after your ``teardown``, what the loaders' workers
    sent by file name and nobody received leaves ``/dev/shm`` (:func:`reclaim_sharing`).

    Example::

        class MyData(TunedDataModule):        # wrap_hooks(MyData) runs at class creation
            def train_dataloader(self):
                return DataLoader(self.train_set, batch_size=64)
    """
    for name, stage in LOADER_HOOKS.items():
        hook = cls.__dict__.get(name)
        if callable(hook) and not getattr(hook, "_dataperf_tuned", False):
            setattr(cls, name, _tuned(hook, stage))
    teardown = getattr(cls, "teardown", None)  # as resolved: a mixin's before TunedDataModule's counts too
    if callable(teardown) and not getattr(teardown, "_dataperf_reclaims", False):
        cls.teardown = _reclaiming(teardown)  # type: ignore[method-assign]


def reclaim_sharing(module: LightningDataModule) -> None:
    """Remove what the workers of the loaders ``module`` made send by file name had sent and nobody received
    (:meth:`~lightning_dataperf.loader.sharing.ShareBy.reclaim`: only workers that have exited)."""
    for share in list(getattr(module, "_sharing", ())):  # those still alive (a collected one reclaimed itself)
        share.reclaim()


@contextlib.contextmanager
def loaders_built_as_they_are() -> Iterator[None]:
    """Inside, ``DataLoader`` objects are built without the plan (autotune's own trial loaders)."""
    _INSIDE_HOOK.bypass = True
    try:
        yield
    finally:
        _INSIDE_HOOK.bypass = False


def _reclaiming(teardown: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(teardown)
    def reclaiming_teardown(self: LightningDataModule, *args: Any, **kwargs: Any) -> Any:
        try:
            return teardown(self, *args, **kwargs)
        finally:
            reclaim_sharing(self)

    reclaiming_teardown._dataperf_reclaims = True  # type: ignore[attr-defined]
    return reclaiming_teardown


def _tuned(hook: Callable[..., Any], stage: str) -> Callable[..., Any]:
    @functools.wraps(hook)
    def tuned_hook(self: LightningDataModule, *args: Any, **kwargs: Any) -> Any:
        if getattr(_INSIDE_HOOK, "active", False):
            return hook(self, *args, **kwargs)
        plans: list[LoaderPlan] = []
        with tuning_new_loaders(self, stage, plans):
            result = hook(self, *args, **kwargs)
        result = self._decode_on_gpu(result, plans)
        self._report(stage, plans)
        return result

    tuned_hook._dataperf_tuned = True  # type: ignore[attr-defined]
    return tuned_hook


@contextlib.contextmanager
def tuning_new_loaders(module: LightningDataModule, stage: str, plans: list[LoaderPlan]) -> Iterator[None]:
    """Within the block, each ``DataLoader.__init__`` call gets the module's plan for unset arguments."""
    original_init = DataLoader.__init__

    def init(loader: DataLoader, *args: Any, **kwargs: Any) -> None:
        if getattr(_INSIDE_HOOK, "bypass", False):
            return original_init(loader, *args, **kwargs)
        bound = _DATALOADER_SIGNATURE.bind_partial(loader, *args, **kwargs)
        explicit = {name: value for name, value in bound.arguments.items() if name != "self"}
        extra = explicit.pop("kwargs", {})
        plan, updates = module._plan(stage, explicit)
        plans.append(plan)
        final = {**explicit, **extra, **updates}
        final = {name: value for name, value in final.items() if value is not None or name not in updates}
        original_init(loader, **final)
        module._finish(stage, loader, plan)

    _INSIDE_HOOK.active = True
    DataLoader.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        DataLoader.__init__ = original_init  # type: ignore[method-assign]
        _INSIDE_HOOK.active = False
