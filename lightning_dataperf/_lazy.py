"""The one PEP 562 helper every ``__init__`` uses, so importing a package does not import torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["attach"]


def attach(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` that import ``exports[name]`` (a submodule) on first use.

    Example::

        __getattr__, __dir__ = attach(__name__, {"StepClock": "clock"})
    """

    def module_getattr(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        # later look-ups skip __getattr__
        vars(importlib.import_module(package))[name] = value
        return value

    def module_dir() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *exports})

    return module_getattr, module_dir
