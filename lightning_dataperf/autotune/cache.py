"""The autotune cache: one JSON file of results, keyed by what decides the answer (docs/autotune.md, section 11).

Example::

    key = cache_key(hardware, dataset, 64, {"collate_fn": collate}, "cuda")
    entry = read_entry(default_cache_path(), key)      # a dict, or None
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.data import sized_len

from lightning_dataperf.telemetry.hardware import Hardware

__all__ = ["CACHE_VERSION", "cache_key", "dataset_fingerprint", "default_cache_path", "read_entry", "write_entry"]

CACHE_VERSION = 4
_WARNED: set[str] = set()


def default_cache_path() -> Path:
    """``$LIGHTNING_DATAPERF_CACHE`` or ``~/.cache/lightning_dataperf/autotune.json``."""
    if env := os.environ.get("LIGHTNING_DATAPERF_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lightning_dataperf" / "autotune.json"


def dataset_fingerprint(dataset: Any) -> str:
    """Type, length and simple attributes of the dataset (override with a ``dataperf_fingerprint()`` method)."""
    custom = getattr(dataset, "dataperf_fingerprint", None)
    if callable(custom):
        return str(custom())
    simple = {
        key: value
        for key, value in sorted(vars(dataset).items())
        if isinstance(value, (int, float, str, bool, tuple, type(None))) and not key.startswith("_")
    }
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    transform = _describe(getattr(dataset, "transform", None))
    return f"{kind}|{sized_len(dataset)}|{simple!r}|transform={transform}"


def _describe(value: Any) -> str:
    """A callable's repr without memory addresses (torchvision's ``Compose`` repr lists every parameter)."""
    if value is None:
        return "none"
    text = repr(value)
    if " at 0x" in text:  # a plain function or object: its qualified name is what is stable
        text = f"{type(value).__module__}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    return re.sub(r"0x[0-9a-f]+", "", text)


def cache_key(hardware: Hardware, dataset: Any, batch_size: int, loader_kwargs: Mapping[str, Any], device: str) -> str:
    collate = loader_kwargs.get("collate_fn")
    collate_name = (
        "default" if collate is None else f"{type(collate).__qualname__}:{getattr(collate, '__qualname__', '')}"
    )
    gpu = hardware.gpus[0].name if hardware.gpus else "none"
    parts = [
        f"v{CACHE_VERSION}",
        f"cpus={hardware.cpus_per_rank}",
        f"ram_gb={round(hardware.ram_total_mb / 1024)}",
        f"gpu={gpu}",
        f"device={device}",
        dataset_fingerprint(dataset),
        f"batch={batch_size}",
        f"collate={collate_name}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def read_entry(path: Path, key: str) -> dict[str, Any] | None:
    """The cached result for ``key``; ``None`` when absent. An unreadable file warns once."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        _warn_once(path, "read", error)
        return None
    try:
        entries = json.loads(text)
    except ValueError as error:
        _warn_once(path, "read", error)
        return None
    entry = entries.get(key) if isinstance(entries, dict) else None
    return entry if isinstance(entry, dict) else None


def write_entry(path: Path, key: str, entry: Mapping[str, Any]) -> bool:
    """Store ``entry`` under ``key`` (atomically); ``False``, with one warning per path, if it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            entries = {}
        if not isinstance(entries, dict):
            entries = {}
        entries[key] = dict(entry)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.replace(path)
    except OSError as error:
        _warn_once(path, "write", error)
        return False
    return True


def _warn_once(path: Path, action: str, error: BaseException) -> None:
    # once per path: a cache that can be neither read nor written says it once
    if str(path) in _WARNED:
        return
    _WARNED.add(str(path))
    warnings.warn(
        f"DataPerf autotune cannot {action} its cache {path} ({error}); training goes on, but the next run "
        "searches again. Point LIGHTNING_DATAPERF_CACHE (or SearchTuning(cache_path=...)) at a "
        "writable file.",
        stacklevel=3,
    )
