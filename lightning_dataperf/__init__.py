"""lightning_dataperf: find and fix input-pipeline bottlenecks in PyTorch Lightning.

Example::

    from lightning import Trainer
    from lightning_dataperf import DataPerfCallback

    trainer = Trainer(callbacks=[DataPerfCallback()])

The exports below are loaded on first use (PEP 562), so ``import lightning_dataperf`` and the
``lightning-dataperf`` command do not pay for torch and Lightning until something needs them. Importing
the package still registers ``strategy="side_stream"`` and ``"ddp_side_stream"`` with Lightning: at
once if ``lightning.pytorch`` is already imported, else as soon as it is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import warnings
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# export name -> submodule that defines it
_EXPORTS = {
    "AutotuneResult": "autotune",
    "autotune_loader": "autotune",
    "DataPerfCallback": "callback",
    "SideStreamCopier": "copier",
    "CopyStats": "copy_stats",
    "CopyTiming": "copy_stats",
    "TunedDataModule": "datamodule",
    "diagnose": "diagnosis",
    "Evidence": "evidence",
    "Diagnosis": "findings",
    "Finding": "findings",
    "Hardware": "hardware",
    "probe_hardware": "hardware",
    "LoaderFacts": "loaders",
    "LoaderSettings": "loaders",
    "article_settings": "policy",
    "recommend_loader_settings": "policy",
    "EpochSummary": "stats",
    "TimingSummary": "stats",
    "SideStreamDDPStrategy": "strategies",
    "SideStreamStrategy": "strategies",
    "SideStreamTransferMixin": "strategies",
    "ShareBy": "sharing",
    "SystemStats": "system_stats",
    "SystemSampler": "telemetry",
    "StepClock": "timing",
    "StepTiming": "timing",
}

# registry name -> (class in lightning_dataperf.strategies, init params Lightning passes to it)
_STRATEGIES = {
    "side_stream": ("SideStreamStrategy", {}),
    "ddp_side_stream": ("SideStreamDDPStrategy", {"start_method": "popen"}),
}

__all__ = [
    "AutotuneResult",
    "CopyStats",
    "CopyTiming",
    "DataPerfCallback",
    "Diagnosis",
    "EpochSummary",
    "Evidence",
    "Finding",
    "Hardware",
    "LoaderFacts",
    "LoaderSettings",
    "ShareBy",
    "SideStreamCopier",
    "SideStreamDDPStrategy",
    "SideStreamStrategy",
    "SideStreamTransferMixin",
    "StepClock",
    "StepTiming",
    "SystemSampler",
    "SystemStats",
    "TimingSummary",
    "TunedDataModule",
    "__version__",
    "article_settings",
    "autotune_loader",
    "diagnose",
    "probe_hardware",
    "recommend_loader_settings",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names come from __getattr__
    from lightning_dataperf.autotune import AutotuneResult, autotune_loader
    from lightning_dataperf.callback import DataPerfCallback
    from lightning_dataperf.copier import SideStreamCopier
    from lightning_dataperf.copy_stats import CopyStats, CopyTiming
    from lightning_dataperf.datamodule import TunedDataModule
    from lightning_dataperf.diagnosis import diagnose
    from lightning_dataperf.evidence import Evidence
    from lightning_dataperf.findings import Diagnosis, Finding
    from lightning_dataperf.hardware import Hardware, probe_hardware
    from lightning_dataperf.loaders import LoaderFacts, LoaderSettings
    from lightning_dataperf.policy import article_settings, recommend_loader_settings
    from lightning_dataperf.sharing import ShareBy
    from lightning_dataperf.stats import EpochSummary, TimingSummary
    from lightning_dataperf.strategies import SideStreamDDPStrategy, SideStreamStrategy, SideStreamTransferMixin
    from lightning_dataperf.system_stats import SystemStats
    from lightning_dataperf.telemetry import SystemSampler
    from lightning_dataperf.timing import StepClock, StepTiming


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _deferred(class_name: str) -> Any:
    """A factory that imports the strategy only when a Trainer asks for it by name.

    Registering must not import ``lightning_dataperf.strategies`` while ``lightning.pytorch`` is still
    loading (that module imports Lightning too); ``strategies`` replaces these with its classes on import.
    """

    def make(**kwargs: Any) -> Any:
        strategies = importlib.import_module(f"{__name__}.strategies")
        return getattr(strategies, class_name)(**kwargs)

    make._dataperf_deferred = True  # type: ignore[attr-defined]
    make.__doc__ = f"lightning_dataperf.strategies.{class_name} (imported on first use)"
    return make


def _register_strategies() -> None:
    """Register ``strategy="side_stream"`` / ``"ddp_side_stream"`` with Lightning's StrategyRegistry."""
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


if "lightning.pytorch" in sys.modules:
    _register_strategies()
elif not any(isinstance(finder, _RegisterWhenLightningLoads) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenLightningLoads())
