"""Registers ``strategy="side_stream"`` and ``"ddp_side_stream"`` with Lightning as soon as it loads."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings
from typing import Any

__all__ = ["register_when_lightning_loads"]

# registry name -> (class in lightning_dataperf.transfer.strategies, init params Lightning passes to it)
_STRATEGIES = {
    "side_stream": ("SideStreamStrategy", {}),
    "ddp_side_stream": ("SideStreamDDPStrategy", {"start_method": "popen"}),
}
_MODULE = "lightning_dataperf.transfer.strategies"


def _deferred(class_name: str) -> Any:
    """A factory that imports the strategy only when a Trainer asks for it by name."""

    def make(**kwargs: Any) -> Any:
        return getattr(importlib.import_module(_MODULE), class_name)(**kwargs)

    make._dataperf_deferred = True  # type: ignore[attr-defined]
    make.__doc__ = f"{_MODULE}.{class_name} (imported on first use)"
    return make


def _register_strategies() -> None:
    """Register the strategies with Lightning's StrategyRegistry (the real classes replace these on import)."""
    try:
        from lightning.pytorch.strategies import StrategyRegistry

        for name, (class_name, init_params) in _STRATEGIES.items():
            if name not in StrategyRegistry:
                factory = _deferred(class_name)
                StrategyRegistry.register(name, factory, description=factory.__doc__, **init_params)
    except Exception as error:  # never break the user's `import lightning`
        warnings.warn(
            f"lightning_dataperf could not register strategy='side_stream': {error!r}", RuntimeWarning, stacklevel=2
        )


class _LoaderThenRegister(importlib.abc.Loader):
    """Runs ``lightning.pytorch``'s own loader, then registers the strategies."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _register_strategies()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _RegisterWhenLightningLoads(importlib.abc.MetaPathFinder):
    """One-shot import hook: when ``lightning.pytorch`` is first imported, register the strategies."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "lightning.pytorch":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderThenRegister(spec.loader)
                return spec
        return None


def register_when_lightning_loads() -> None:
    """Register now if ``lightning.pytorch`` is loaded, else as soon as it is (once per process)."""
    if "lightning.pytorch" in sys.modules:
        _register_strategies()
    elif not any(isinstance(finder, _RegisterWhenLightningLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenLightningLoads())
